"""Object names, in-cluster DNS names, and the addresses and URLs one role gives another.

Every name is a function of the EPDDeployment's name (and a role, and a prefill pool), so render, status and
the tests find an object without searching. DNS names use "<service>.<namespace>.svc", which resolves with
any cluster domain through the pod's DNS search path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from epd_connectors.config.master import MasterConfig
from epd_connectors.config.roles import Role
from epd_operator.api.kube import DNS_1035, SERVICE_NAME_MAX, STATEFULSET_NAME_MAX
from epd_operator.derive.site import ClusterNetwork, Network

_DNS_1035 = re.compile(DNS_1035)
MAIN_POOL = "main"
"""Label value of the main prefill pool (additional pools use their own names, so this one is reserved)."""


ROLES = (
    Role.MASTER,
    Role.STORE_CLIENT,
    Role.ENCODER,
    Role.PREFILL,
    Role.DECODE,
    Role.PD,
    Role.PROXY,
)
ROLE_TOKENS = frozenset(role.split("-")[0] for role in ROLES)
"""The first hyphen-separated token of every role name: every child's name is "<name>-<role>..." (see Names)."""


@dataclass(frozen=True)
class Names:
    """Names of one EPDDeployment's children, all "<name>-<suffix>", and why two deployments never share one.

    The suffixes: "<role>" (workload, Service, PDB, NetworkPolicy, and the proxy's ServiceAccount, Role and
    RoleBinding), "prefill-<pool>" (an additional prefill pool's workload, Service and PDB), and either with
    "-bundle" (the ConfigMap). "a-<s>" = "b-<t>" with a != b means one suffix is "<w>-<the other>": a
    hyphen-tail of some suffix would itself be a suffix. Every suffix starts with a role token (ROLE_TOKENS);
    the tails start with a pool name, "client" (of store-client) or "bundle", and the CRD keeps pool names to
    one hyphen-free token that is none of the role tokens (nor bundle, main, client). So no tail is a suffix,
    and a child's name tells its deployment's name. tests/unit/operator/test_names.py checks the tails on
    every rendered child; apply.conflicts still refuses to apply over another deployment's object.
    """

    deployment: str
    namespace: str
    network: Network = field(default_factory=ClusterNetwork)
    """How a Service name becomes a host (derive.site): cluster DNS unless the local runner says otherwise."""

    def workload(self, role: str, pool: str | None = None) -> str:
        """The role's workload, its Service, PDB and the prefix of its ConfigMap: "<name>-<role>[-<pool>]"."""
        return f"{self.deployment}-{role}" + (f"-{pool}" if pool else "")

    def bundle_configmap(self, workload: str) -> str:
        return f"{workload}-bundle"

    def network_policy(self, role: str) -> str:
        return f"{self.deployment}-{role}"

    def host(self, service: str) -> str:
        """The Service's DNS name as every pod of the namespace resolves it (the site's host locally)."""
        return self.network.host(service, self.namespace)

    @property
    def master_host(self) -> str:
        return self.host(self.workload(Role.MASTER))

    def master_address(self, master: MasterConfig) -> str:
        """master_server_address of every store user (HOST:RPC_PORT through the master's Service)."""
        return master.client_master_address(self.master_host)

    def master_health_url(self, master: MasterConfig) -> str:
        return master.health_url(self.master_host)

    def master_metrics_url(self, master: MasterConfig) -> str:
        return master.metrics_url(self.master_host)

    def metadata_server(self, master: MasterConfig) -> str:
        """P2PHANDSHAKE, or the master's HTTP metadata URL when it serves one."""
        return master.metadata_server(self.master_host)

    def proxy_url(self, service_port: int) -> str:
        """The deployment's endpoint: the proxy Service (OpenAI-compatible API)."""
        return f"http://{self.host(self.workload(Role.PROXY))}:{service_port}"


def name_problems(names: Names, services: list[str], statefulsets: list[str]) -> list[str]:
    """Names Kubernetes would refuse: Services are DNS-1035 labels, StatefulSet names leave room for a hash."""
    found: list[str] = []
    for service in services:
        if len(service) > SERVICE_NAME_MAX or not _DNS_1035.match(service):
            room = SERVICE_NAME_MAX - (len(service) - len(names.deployment))
            found.append(
                f"metadata.name = {names.deployment!r}: the Service {service!r} would not be a DNS label "
                f"(lowercase letters, digits, '-', starting with a letter, at most {SERVICE_NAME_MAX}). "
                f"Fix: use a name of that form with at most {max(room, 1)} characters"
                + (" (or shorter prefill pool names)" if f"-{Role.PREFILL}-" in service else "")
            )
    for sts in statefulsets:
        if len(sts) > STATEFULSET_NAME_MAX:
            room = STATEFULSET_NAME_MAX - (len(sts) - len(names.deployment))
            found.append(
                f"metadata.name = {names.deployment!r}: the StatefulSet {sts!r} is longer than "
                f"{STATEFULSET_NAME_MAX} characters. Fix: use a name of at most {room} characters"
            )
    return found
