"""`epd-proxy`: the proxy's command line; `epd-launch proxy` runs it with `--bundle PATH`.

The roster comes from the bundle's peers and/or flags (`--encoder`, `--pd`, `--prefill`, `--decode`, repeated);
`--discover` watches the roles' Services' EndpointSlices instead (Kubernetes client extra). Served by uvicorn
(httptools and uvloop when installed), without an access log: the proxy is on every request's path.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from epd_connectors.config.base import ConfigError
from epd_connectors.config.bundle import Peers, load_bundle
from epd_connectors.proxy import settings as s
from epd_connectors.proxy.app import Discovery, ProxyApp
from epd_connectors.proxy.discovery_slices import RoleWatch
from epd_connectors.proxy.roster import Roster
from epd_connectors.proxy.static import StaticRoster, from_peers, watches_from_peers

ENV_PREFIX = "EPD_PROXY_"
"""Flags may also come from the environment (EPD_PROXY_DISCOVER=1, EPD_PROXY_KV_PROTOCOL=mooncake, ...): the pod
runs `epd-proxy --bundle PATH` only, and the bundle's `env` is how the operator sets the rest."""


def _env_defaults(p: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Defaults from EPD_PROXY_<FLAG> for every single-valued flag; the command line still wins."""
    for action in p._actions:  # argparse has no public way to list a parser's options
        if not action.option_strings or action.dest == "help":
            continue
        value = environ.get(ENV_PREFIX + action.dest.upper())
        if value is None:
            continue
        if action.nargs == 0:  # a switch
            action.default = value.lower() in ("1", "true", "yes")
        elif isinstance(action.default, list):  # a repeated flag: comma-separated
            action.default = [action.type(v) if callable(action.type) else v for v in value.split(",") if v]
        else:
            action.default = action.type(value) if callable(action.type) else value


class _Repeat(argparse.Action):
    """A repeated flag whose command-line values replace its default (EPD_PROXY_<FLAG>, comma-separated) instead
    of adding to it, as argparse's "append" would: the command line wins for lists too."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        current = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*([] if current is self.default else current), values])


def parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epd-proxy", description="OpenAI-compatible E/P/D proxy for vLLM")
    p.add_argument("--bundle", type=Path, help="the proxy role's bundle (peers and listener)")
    p.add_argument("--host", help="listen address (bundle proxy.host, else 0.0.0.0)")
    p.add_argument("--port", type=int, help="listen port (bundle proxy.port, else 8000)")
    for flag, what in (("encoder", "encoder"), ("prefill", "prefill"), ("decode", "decode"), ("pd", "combined PD")):
        p.add_argument(f"--{flag}", action=_Repeat, default=[], metavar="URL", help=f"{what} base URL (repeat)")
    p.add_argument(
        "--ec-consumer",
        action=_Repeat,
        default=[],
        metavar="tcp://HOST:PORT",
        help="EC control address per consumer and DP replica, in consumer order (ECMooncakeConnector)",
    )
    p.add_argument(
        "--prefill-bootstrap-port",
        action=_Repeat,
        type=int,
        default=[],
        metavar="PORT",
        help="MooncakeConnector bootstrap port per prefill (Service with --discover), or one for all",
    )
    p.add_argument("--kv-protocol", choices=[k.value for k in s.KVProtocol], default=s.KVProtocol.PASSIVE.value)
    p.add_argument("--no-encoder-affinity", action="store_true", help="spread media by load, not by content hash")
    p.add_argument("--retries", type=int, default=s.DEFAULT_RETRIES)
    p.add_argument("--encoder-batch-max", type=int, default=s.DEFAULT_ENCODER_BATCH_MAX)
    p.add_argument("--connect-timeout", type=float, default=s.DEFAULT_CONNECT_TIMEOUT_S)
    p.add_argument("--encode-timeout", type=float, default=s.DEFAULT_ENCODE_TIMEOUT_S)
    p.add_argument("--prefill-timeout", type=float, default=s.DEFAULT_PREFILL_TIMEOUT_S)
    p.add_argument("--first-token-timeout", type=float, default=s.DEFAULT_FIRST_TOKEN_TIMEOUT_S)
    p.add_argument("--total-timeout", type=float, default=s.DEFAULT_TOTAL_TIMEOUT_S)
    p.add_argument(
        "--probe-interval",
        type=float,
        default=s.DEFAULT_PROBE_INTERVAL_S,
        metavar="SECONDS",
        help="between /health probes of each instance; 0: no probing, instances are used as listed or discovered",
    )
    p.add_argument("--discover", action="store_true", help="follow the roles' EndpointSlices (needs the bundle)")
    p.add_argument("--ec-port", type=int, help="discovery: consumers' EC base control port (push connector)")
    for flag, what in (("tp", "tensor"), ("dp", "data")):
        p.add_argument(
            f"--ec-{flag}-size",
            action=_Repeat,
            type=int,
            default=[],
            metavar="N",
            help=f"discovery: {what}-parallel size per EC consumer Service, in the bundle's order (or one for all; "
            "the control port of DP replica d is ec-port + d*tp)",
        )
    p.add_argument("--log-level", default="warning")
    _env_defaults(p, os.environ if environ is None else environ)
    return p


def options_from(args: argparse.Namespace, affinity_default: bool) -> s.ProxyOptions:
    return s.ProxyOptions(
        timeouts=s.Timeouts(
            connect=args.connect_timeout,
            encode=args.encode_timeout,
            prefill=args.prefill_timeout,
            first_token=args.first_token_timeout,
            total=args.total_timeout,
        ),
        limits=s.Limits(
            retries=max(0, args.retries),
            encoder_batch_max=max(1, args.encoder_batch_max),
            probe_interval_s=args.probe_interval,
        ),
        encoder_affinity=affinity_default and not args.no_encoder_affinity,
        kv_protocol=s.KVProtocol(args.kv_protocol),
    )


def build(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[ProxyApp, str, int, str]:
    """The app and where to listen, from the command line (and EPD_PROXY_* variables); SystemExit with one line
    on a bad configuration."""
    args = parser(environ).parse_args(argv)
    host, port, affinity = "0.0.0.0", 8000, True
    static = StaticRoster()
    discovery: Discovery | None = None
    try:
        if args.bundle is not None:
            bundle = load_bundle(args.bundle)
            if bundle.proxy is not None:
                host, port, affinity = bundle.proxy.host, bundle.proxy.port, bundle.proxy.encoder_affinity
            static = from_peers(bundle.peers)
            if args.discover:
                discovery = _discovery(bundle.namespace, watches_from(args, bundle.peers))
        elif args.discover:
            raise ValueError("--discover needs --bundle (the Services come from its peers)")
        static = StaticRoster(
            encoders=args.encoder or static.encoders,
            prefill=args.prefill or static.prefill,
            decode=args.decode or static.decode,
            pd=args.pd or static.pd,
            ec_consumers=args.ec_consumer or static.ec_consumers,
            bootstrap_ports=args.prefill_bootstrap_port,
        )
        specs = static.specs()
    except (ConfigError, ValueError) as exc:
        raise SystemExit(f"epd-proxy: {exc}") from exc
    options = options_from(args, affinity)
    # With discovery the roles come from the bundle, the members from the EndpointSlices. Without probing
    # (Limits.probing) static members are admitted at once, since no probe will.
    roster = Roster.build(
        {role: [] for role in specs} if discovery is not None else specs, healthy=not options.limits.probing
    )
    app = ProxyApp(roster, options, discovery=discovery)
    return app, args.host or host, args.port or port, args.log_level


def watches_from(args: argparse.Namespace, peers: Peers) -> list[RoleWatch]:
    """The Services `--discover` watches, each with its own consumer settings; ValueError if they do not fit."""
    return watches_from_peers(
        peers,
        ec_port=args.ec_port,
        ec_tp=args.ec_tp_size,
        ec_dp=args.ec_dp_size,
        bootstrap_ports=args.prefill_bootstrap_port,
    )


def _discovery(namespace: str, watches: list[RoleWatch]) -> Discovery:
    from epd_connectors.proxy.discovery import kubernetes_discovery  # noqa: PLC0415 - only with --discover

    return kubernetes_discovery(namespace, watches)


def main(argv: Sequence[str] | None = None) -> int:
    app, host, port, level = build(argv)
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn  # noqa: PLC0415 - the server only when serving; build() stays importable without it

    loop = "uvloop" if _has("uvloop") else "asyncio"
    http = "httptools" if _has("httptools") else "h11"
    probing = "" if app.options.limits.probing else " (health probing off)"
    print(
        f"epd-proxy: listening on {host}:{port} roles={sorted(r.value for r in app.roster.roles)}{probing}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop=loop,
        http=http,
        access_log=False,
        log_level=level,
        lifespan="on",
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=75,
    )
    return 0


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
