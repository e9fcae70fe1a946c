"""Where a deployment runs: how one role reaches another (the network) and where its files are (the paths).

This is the one seam between a cluster and a laptop. Render asks the site for every address it writes into a
bundle: a host for a workload's Service, a port by workload and port name, and the host a server binds. In a
cluster (`CLUSTER`, the default) that is the Service's DNS name and the fixed container ports of derive.ports,
so the rendered objects do not change; the local runner passes a `LocalNetwork`, which gives every workload
127.0.0.1 and its own ports, so many roles share one machine. Pure: no I/O, no sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

from epd_connectors.config.base import MAX_PORT
from epd_operator.api import constants as c
from epd_operator.derive import ports

LOOPBACK: Final = "127.0.0.1"
SHARED_DIR: Final = "/mnt/epd-shared"
"""Where spec.sharedStorage is mounted in every pod that uses a shared-storage connector."""
OFFLOAD_DIR: Final = "/mnt/epd-offload"
"""The store client's SSD tier (MOONCAKE_OFFLOAD_FILE_STORAGE_PATH)."""
DEFAULT_LOCAL_BASE_PORT: Final = 31000
"""First port a LocalNetwork hands out (below Linux's ephemeral range, 32768 and up)."""


LOCAL_PORT_SPANS: Final = {ports.ec_port_name(0): 8}
"""Ports a LocalNetwork keeps free after the one it hands out: an EC consumer's TP rank r listens on its
control port + r (derive.ports), so up to TP 8 fits."""


class Network(Protocol):
    """How roles address each other."""

    @property
    def bind_host(self) -> str | None:
        """The address servers listen on; None keeps each config's default (all interfaces, as in a pod)."""
        ...

    @property
    def own_address(self) -> str | None:
        """The address a process advertises to its peers when the site knows it before the process starts;
        None in a cluster, where only the pod knows its IP (the bundle says POD_IP_PLACEHOLDER)."""
        ...

    @property
    def static_roster(self) -> bool:
        """Whether the proxy's bundle lists every instance and EC consumer address and the proxy uses just that;
        a cluster's proxy follows the Services' EndpointSlices instead (pods and their IPs come and go)."""
        ...

    def host(self, service: str, namespace: str) -> str:
        """How any role reaches the workload called `service`."""
        ...

    def port(self, workload: str, name: str, default: int) -> int:
        """The workload's port called `name` (derive.ports names); `default` is the cluster's fixed value."""
        ...


@dataclass(frozen=True)
class ClusterNetwork:
    """Kubernetes: Service DNS names ("<service>.<namespace>.svc", resolved through the pod's search path) and
    fixed ports (every pod has its own network namespace, so equal ports on two pods never collide)."""

    bind_host: str | None = None
    own_address: str | None = None
    static_roster: bool = False

    def host(self, service: str, namespace: str) -> str:
        return f"{service}.{namespace}.svc"

    def port(self, workload: str, name: str, default: int) -> int:
        return default


@dataclass
class LocalNetwork:
    """One machine, no cluster: every workload is 127.0.0.1 and every (workload, port name) gets its own port,
    handed out in the order render asks, from `base_port` up, skipping `taken`. The same question always gets
    the same answer, so the port a server binds and the port its peers dial can only agree."""

    base_port: int = DEFAULT_LOCAL_BASE_PORT
    taken: frozenset[int] = frozenset()
    """Ports to skip (known to be in use)."""
    assigned: dict[tuple[str, str], int] = field(default_factory=dict)
    """(workload, port name) -> port: the address plan, filled while rendering."""

    bind_host: str | None = LOOPBACK
    own_address: str | None = LOOPBACK
    static_roster: bool = True

    def host(self, service: str, namespace: str) -> str:
        return LOOPBACK

    def port(self, workload: str, name: str, default: int) -> int:
        key = (workload, name)
        if key not in self.assigned:
            used = set(self.taken)
            for (_, other), port in self.assigned.items():
                used.update(range(port, port + LOCAL_PORT_SPANS.get(other, 1)))
            span = LOCAL_PORT_SPANS.get(name, 1)
            candidate = self.base_port
            while any(p in used for p in range(candidate, candidate + span)):
                candidate += 1
            if candidate + span - 1 > MAX_PORT:
                raise ValueError(f"no port left above {self.base_port} for {workload} {name}")
            self.assigned[key] = candidate
        return self.assigned[key]


@dataclass(frozen=True)
class Paths:
    """Where a role's files are: the mounts of a pod by default, folders of a work directory locally."""

    model_dir: str = c.MODEL_MOUNT_DIR
    """The model volume; spec.model.path is relative to it."""
    shared_dir: str = SHARED_DIR
    """spec.sharedStorage (the EC connector uses <shared_dir>/ec, the KV connector <shared_dir>/kv)."""
    work_dir: str = c.WORK_DIR
    """The writable work folder (the master's tenant policy)."""
    offload_dir: str = OFFLOAD_DIR


@dataclass(frozen=True)
class Site:
    """The network and the paths together: everything that differs between a cluster and a laptop."""

    network: Network = field(default_factory=ClusterNetwork)
    paths: Paths = field(default_factory=Paths)


CLUSTER: Final = Site()
"""What the operator renders for Kubernetes."""
