"""What a role's process will be, computed from its bundle without any I/O.

`plan_launch` is the single place that maps a bundle to argv, environment, files and waits, so `--dry-run`,
the tests and the real launch all see the same thing, and a reader can follow one function from a bundle field
to the flag it becomes.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from epd_connectors.config.bundle import POD_IP_ENV, POD_IP_PLACEHOLDER, RoleBundle
from epd_connectors.config.ec_transfer import ECMooncakeConsumer
from epd_connectors.config.mooncake import StoreMode, ha_client_defaults
from epd_connectors.config.roles import VLLM_ROLES, Role
from epd_connectors.config.vllm import SERVER_MODULE
from epd_connectors.launch.readiness import Dependency

MOONCAKE_CONFIG_FILE = "mooncake_config.json"
BUNDLE_PATH_ENV = "EPD_BUNDLE_PATH"
HOST_IP_ENV = "VLLM_HOST_IP"
"""What vLLM and its transfer engine advertise to peers; in a pod it must be the pod's own IP (facts.md)."""
PROXY_COMMAND = "epd-proxy"


@dataclass(frozen=True)
class LaunchPlan:
    """Everything `epd-launch` does for one role, in order: write files, set env, wait, exec argv."""

    argv: list[str]
    env: dict[str, str]
    """Only the variables the launcher sets; the process also inherits the pod's environment."""
    files: dict[str, str] = field(default_factory=dict)
    """Absolute path -> content, written before the waits."""
    waits: list[Dependency] = field(default_factory=list)
    supervised: bool = False
    """As a container's PID 1, run argv as a child rather than exec it (module supervise): its program has no
    SIGTERM handler, so as PID 1 it would ignore the SIGTERM that deleting its pod sends."""


def plan_launch(
    bundle: RoleBundle, *, workdir: str, bundle_path: str, environ: Mapping[str, str] | None = None
) -> LaunchPlan:
    """The complete plan for the bundle's role. `environ` is the pod's environment (for POD_IP)."""
    environ = environ or {}
    pod_ip = environ.get(POD_IP_ENV)
    files: dict[str, str] = {}
    env: dict[str, str] = {**bundle.env, BUNDLE_PATH_ENV: bundle_path}
    supervised = False

    if bundle.role is Role.MASTER:
        assert bundle.master is not None  # the bundle's role rules guarantee the section
        master = bundle.master
        if master.ha is not None:
            # An HA master advertises rpc_address to clients through the election backend.
            address = _pod_address(master.rpc_address, "master.rpc_address", pod_ip)
            master = master.model_validate({**master.model_dump(), "rpc_address": address})
            supervised = True  # Mooncake's master installs its SIGTERM handler only without HA
        argv = master.argv()
        env.update(master.env())
        files.update(master.files())
    elif bundle.role is Role.STORE_CLIENT:
        assert bundle.store_client is not None
        client = bundle.store_client
        # The owner advertises its host to every requester; only the pod knows its own IP.
        host = _pod_address(client.host, "store_client.host", pod_ip)
        client = client.model_validate({**client.model_dump(), "host": host})
        argv = client.argv()
        env.update(client.env() | _unless_set(ha_client_defaults(client.cluster_id), env, environ))
    elif bundle.role in VLLM_ROLES:
        assert bundle.vllm is not None
        mooncake = bundle.mooncake
        if mooncake is not None:
            config_path = str(PurePosixPath(workdir, MOONCAKE_CONFIG_FILE))
            files[config_path] = mooncake.to_json()
            env["MOONCAKE_CONFIG_PATH"] = config_path
            env.update(mooncake.env() | _unless_set(ha_client_defaults(mooncake.cluster_id), env, environ))
        env.update(bundle.vllm.env())
        if pod_ip:
            env[HOST_IP_ENV] = pod_ip
        ec = bundle.ec_transfer
        if isinstance(ec, ECMooncakeConsumer):
            # The consumer's control server binds and advertises ec_ip; only the pod knows its own IP.
            ec_ip = _pod_address(ec.ec_ip, "ec_transfer.ec_ip", pod_ip)
            ec = ECMooncakeConsumer.model_validate({**ec.model_dump(), "ec_ip": ec_ip})
        argv = [sys.executable, "-m", SERVER_MODULE, *bundle.vllm.argv(ec, bundle.kv_transfer)]
    else:  # Role.PROXY
        argv = [PROXY_COMMAND, "--bundle", bundle_path]
    return LaunchPlan(argv=argv, env=env, files=files, waits=dependencies_of(bundle), supervised=supervised)


class LaunchError(ValueError):
    """The bundle cannot run in this environment; ``str()`` is the one line the launcher prints."""


def _unless_set(defaults: Mapping[str, str], *given: Mapping[str, str]) -> dict[str, str]:
    """The defaults neither the spec (the bundle's env) nor the pod's environment sets."""
    return {key: value for key, value in defaults.items() if not any(key in env for env in given)}


def _pod_address(value: str, field: str, pod_ip: str | None) -> str:
    """The pod's own IP when the pod has one, else the bundle's value, which must then be a real address."""
    if pod_ip:
        return pod_ip
    if value == POD_IP_PLACEHOLDER:
        raise LaunchError(
            f"{field} = {value!r}: only the pod knows this address and {POD_IP_ENV} is not set. "
            f"Fix: set {POD_IP_ENV} from the downward API (fieldRef status.podIP), or give a real address"
        )
    return value


def dependencies_of(bundle: RoleBundle) -> list[Dependency]:
    """Store users wait for the master; encoders of a standalone store also wait for a mounted segment."""
    waits: list[Dependency] = []
    uses_store = bundle.role is Role.STORE_CLIENT or bundle.mooncake is not None
    if uses_store and bundle.peers.master_health_url:
        waits.append(Dependency("master-health", bundle.peers.master_health_url, "the Mooncake master"))
    standalone = bundle.mooncake is not None and bundle.mooncake.mode is StoreMode.STANDALONE_STORE
    if bundle.role is Role.ENCODER and standalone and bundle.peers.master_metrics_url:
        waits.append(Dependency("store-capacity", bundle.peers.master_metrics_url, "a Mooncake store owner"))
    return waits
