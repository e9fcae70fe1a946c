"""`epd-proxy`: the proxy's command line; `epd-launch proxy` runs it with `--bundle PATH`.

The roster comes from the bundle's peers and/or flags (`--encoder`, `--pd`, `--prefill`, `--decode`, repeated);
with the bundle's proxy.discover (or `--discover`) it watches the peers' Services' EndpointSlices instead
(Kubernetes client extra). Served by the proxy's own HTTP/1.1 server (`server`) on uvloop when installed,
without an access log: the proxy is on every request's path.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from epd_connectors.config.base import ConfigError
from epd_connectors.config.bundle import KVProtocol, ProxySettings, load_bundle
from epd_connectors.config.layered import Layered
from epd_connectors.config.roles import Role
from epd_connectors.proxy import settings as s
from epd_connectors.proxy.app import Discovery, ProxyApp
from epd_connectors.proxy.discovery_slices import RoleWatch
from epd_connectors.proxy.roster import Roster
from epd_connectors.proxy.server import Server
from epd_connectors.proxy.static import StaticRoster, from_peers, watches_from_peers

ENV_PREFIX = "EPD_PROXY_"
"""Every flag may also come from EPD_PROXY_<FLAG> (EPD_PROXY_RETRIES=5, EPD_PROXY_PD=URL,URL), for a proxy
started by hand; a flag wins over its variable, a variable over the bundle's value."""


def parser() -> argparse.ArgumentParser:
    """Every default is None: `Layered` tells a flag that was not given from one that was."""
    p = argparse.ArgumentParser(
        prog="epd-proxy",
        description="OpenAI-compatible E/P/D proxy for vLLM. Every flag also reads EPD_PROXY_<FLAG> (lists "
        "comma-separated); a flag wins over its variable, a variable over the bundle.",
    )
    p.add_argument("--bundle", type=Path, help="the proxy role's bundle (listener, peers, KV protocol, discovery)")
    p.add_argument("--host", help="listen address (bundle proxy.host, else 0.0.0.0)")
    p.add_argument("--port", type=int, help="listen port (bundle proxy.port, else 8000)")
    for flag, what in (("encoder", "encoder"), ("prefill", "prefill"), ("decode", "decode"), ("pd", "combined PD")):
        p.add_argument(f"--{flag}", action="append", metavar="URL", help=f"{what} base URL (repeat)")
    p.add_argument(
        "--ec-consumer",
        action="append",
        metavar="tcp://HOST:PORT",
        help="EC control address per consumer and DP replica, in consumer order (ECMooncakeConnector)",
    )
    p.add_argument(
        "--prefill-bootstrap-port",
        action="append",
        type=int,
        metavar="PORT",
        help="MooncakeConnector bootstrap port per prefill URL, or one for all (bundle: each prefill's own)",
    )
    p.add_argument("--kv-protocol", type=KVProtocol, choices=list(KVProtocol), help="bundle proxy.kv_protocol")
    p.add_argument("--no-encoder-affinity", action="store_true", default=None, help="spread media by load")
    p.add_argument("--retries", type=int, help=f"default {s.DEFAULT_RETRIES}")
    p.add_argument("--encoder-batch-max", type=int, help=f"default {s.DEFAULT_ENCODER_BATCH_MAX}")
    p.add_argument("--connect-timeout", type=float, help=f"seconds, default {s.DEFAULT_CONNECT_TIMEOUT_S}")
    p.add_argument("--encode-timeout", type=float, help=f"seconds, default {s.DEFAULT_ENCODE_TIMEOUT_S}")
    p.add_argument("--prefill-timeout", type=float, help=f"seconds, default {s.DEFAULT_PREFILL_TIMEOUT_S}")
    p.add_argument("--first-token-timeout", type=float, help=f"seconds, default {s.DEFAULT_FIRST_TOKEN_TIMEOUT_S}")
    p.add_argument("--total-timeout", type=float, help=f"seconds, default {s.DEFAULT_TOTAL_TIMEOUT_S}")
    p.add_argument(
        "--probe-interval",
        type=float,
        metavar="SECONDS",
        help="between /health probes of each instance; 0: no probing, instances are used as listed or discovered "
        f"(default {s.DEFAULT_PROBE_INTERVAL_S})",
    )
    p.add_argument(
        "--canary-interval",
        type=float,
        metavar="SECONDS",
        help="between canaries of each transfer path that works (encoder -> EC consumer, prefill -> decode); 0: "
        f"none, every path counts as working (bundle proxy.canary_interval_s, default {s.DEFAULT_CANARY_INTERVAL_S})",
    )
    p.add_argument(
        "--canary-timeout",
        type=float,
        metavar="SECONDS",
        help=f"for one canary (bundle proxy.canary_timeout_s, default {s.DEFAULT_CANARY_TIMEOUT_S})",
    )
    p.add_argument(
        "--max-body-bytes", type=int, help=f"largest client request body (default {s.DEFAULT_MAX_BODY_BYTES})"
    )
    p.add_argument(
        "--head-timeout",
        type=float,
        metavar="SECONDS",
        help=f"for a client's request head to arrive, else 408 (default {s.DEFAULT_HEAD_TIMEOUT_S})",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        metavar="SECONDS",
        help=f"a client's request body may stall, else 408 (default {s.DEFAULT_BODY_TIMEOUT_S})",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        help=f"client connections open at once; more are answered 503 (default {s.DEFAULT_MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--discover",
        action="store_true",
        default=None,
        help="follow the peers' EndpointSlices (bundle proxy.discover; needs the bundle)",
    )
    p.add_argument("--log-level", help="default warning")
    return p


def options_from(given: Layered, bundle: ProxySettings) -> s.ProxyOptions:
    """Timeouts, limits and routing switches: flags, then EPD_PROXY_*, then the bundle, then the defaults."""
    return s.ProxyOptions(
        timeouts=s.Timeouts(
            connect=given.value("connect_timeout", s.DEFAULT_CONNECT_TIMEOUT_S, float),
            encode=given.value("encode_timeout", s.DEFAULT_ENCODE_TIMEOUT_S, float),
            prefill=given.value("prefill_timeout", s.DEFAULT_PREFILL_TIMEOUT_S, float),
            first_token=given.value("first_token_timeout", s.DEFAULT_FIRST_TOKEN_TIMEOUT_S, float),
            total=given.value("total_timeout", s.DEFAULT_TOTAL_TIMEOUT_S, float),
        ),
        limits=s.Limits(
            retries=max(0, given.value("retries", s.DEFAULT_RETRIES, int)),
            encoder_batch_max=max(1, given.value("encoder_batch_max", s.DEFAULT_ENCODER_BATCH_MAX, int)),
            probe_interval_s=given.value("probe_interval", s.DEFAULT_PROBE_INTERVAL_S, float),
        ),
        clients=s.Clients(
            max_body_bytes=max(1, given.value("max_body_bytes", s.DEFAULT_MAX_BODY_BYTES, int)),
            head_timeout_s=given.value("head_timeout", s.DEFAULT_HEAD_TIMEOUT_S, float),
            body_timeout_s=given.value("body_timeout", s.DEFAULT_BODY_TIMEOUT_S, float),
            max_connections=max(1, given.value("max_connections", s.DEFAULT_MAX_CONNECTIONS, int)),
        ),
        media=bundle.media,
        encoder_wake_s=bundle.encoder_wake_s,
        encoder_affinity=bundle.encoder_affinity and not given.switch("no_encoder_affinity"),
        kv_protocol=given.value("kv_protocol", bundle.kv_protocol, KVProtocol),
        canary=s.Canary(
            interval_s=given.value(
                "canary_interval", _or(bundle.canary_interval_s, s.DEFAULT_CANARY_INTERVAL_S), float
            ),
            timeout_s=max(
                MIN_CANARY_TIMEOUT_S,
                given.value("canary_timeout", _or(bundle.canary_timeout_s, s.DEFAULT_CANARY_TIMEOUT_S), float),
            ),
            media=bundle.canary_media or "image",
        ),
    )


MIN_CANARY_TIMEOUT_S = 0.1
"""The request path's deadline sweep runs every quarter of the shortest limit: a zero would make it spin."""


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def build(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[ProxyApp, str, int, str]:
    """The app and where to listen, from the bundle, the command line and EPD_PROXY_* variables; SystemExit
    with one line on a bad configuration."""
    given = Layered(parser().parse_args(argv), os.environ if environ is None else environ, ENV_PREFIX)
    try:
        path = given.value("bundle", None, Path)
        bundle = load_bundle(path) if path is not None else None
        own = bundle.proxy if bundle is not None and bundle.proxy is not None else ProxySettings()
        static = from_peers(bundle.peers) if bundle is not None else StaticRoster()
        discovery: Discovery | None = None
        if given.switch("discover", own.discover):
            if bundle is None:
                raise ValueError("--discover needs --bundle (the Services come from its peers)")
            discovery = _discovery(bundle.namespace, watches_from_peers(bundle.peers), bundle.deployment)
        listed_ec = given.items("ec_consumer", str)  # addresses given by hand replace the bundle's
        static = StaticRoster(
            encoders=given.items("encoder", str, static.encoders),
            prefill=given.items("prefill", str, static.prefill),
            decode=given.items("decode", str, static.decode),
            pd=given.items("pd", str, static.pd),
            ec_consumers=listed_ec or static.ec_consumers,
            ec_per_consumer=() if listed_ec else static.ec_per_consumer,
            bootstrap_ports=given.items("prefill_bootstrap_port", int, static.bootstrap_ports),
        )
        specs = static.specs()
        options = options_from(given, own)
    except (ConfigError, ValueError) as exc:
        raise SystemExit(f"epd-proxy: {exc}") from exc
    # With discovery the roles come from the bundle, the members from the EndpointSlices. Without probing
    # (Limits.probing) static members are admitted at once, since no probe will.
    roster = Roster.build(
        {role: [] for role in specs} if discovery is not None else specs,
        healthy=not options.limits.probing,
        optional=frozenset({Role.ENCODER}) if options.encoder_wake_s else frozenset(),
    )
    app = ProxyApp(roster, options, discovery=discovery)
    host = given.value("host", own.host, str)
    return app, host, given.value("port", own.port, int), given.value("log_level", "warning", str)


def _discovery(namespace: str, watches: list[RoleWatch], deployment: str) -> Discovery:
    from epd_connectors.proxy.discovery import kubernetes_discovery  # noqa: PLC0415 - only with --discover

    return kubernetes_discovery(namespace, watches, deployment=deployment)


SHUTDOWN_GRACE_S = 25.0
"""Seconds answers in progress get after SIGTERM, inside Kubernetes' default 30 s grace period."""
GC_THRESHOLD = (50_000, 50, 100)
"""The youngest generation is collected after this many allocations instead of 700: a request allocates a
few hundred objects and frees nearly all of them by reference counting, so the default thresholds run the
cyclic collector every few requests, for nothing."""


def main(argv: Sequence[str] | None = None) -> int:
    app, host, port, level = build(argv)
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    probing = "" if app.options.limits.probing else " (health probing off)"
    print(
        f"epd-proxy: listening on {host}:{port} roles={sorted(r.value for r in app.roster.roles)}{probing}",
        file=sys.stderr,
        flush=True,
    )
    if _has("uvloop"):
        import uvloop  # noqa: PLC0415 - optional: the proxy runs on asyncio's own loop without it

        uvloop.run(serve(app, host, port))
    else:
        asyncio.run(serve(app, host, port))
    return 0


async def serve(app: ProxyApp, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, then let answers in progress finish (up to SHUTDOWN_GRACE_S)."""
    listener = Server.listen(host, port)
    await app.startup()
    server = Server(app, error_body=app.error_body, clients=app.options.clients)
    server.start(listener)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # What exists now lives as long as the process: moved out of the collector's sight, so no collection
    # walks it again.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        await stop.wait()
    finally:
        await server.stop(SHUTDOWN_GRACE_S)
        await app.shutdown()


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    sys.exit(main())
