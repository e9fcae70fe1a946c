"""The proxy's bundle, Deployment and Service: the deployment's one entry point.

The proxy's peers are Service DNS names, never pod lists, so scaling any role leaves the proxy's bundle (and
its pods) untouched. At run time the proxy watches those Services' EndpointSlices (its own ServiceAccount may
read them, nothing else), so it knows every pod: encoder affinity needs the individual encoders, and an EC
push needs each consumer pod's control address, which the proxy derives from the pod's IP and its consumer
endpoint's `ec` (locally, from the endpoint's own host).
"""

from __future__ import annotations

from typing import Any, Final

from epd_connectors.config.bundle import (
    PROXY_LIVENESS_PATH,
    PROXY_READINESS_PATH,
    CanaryMedia,
    ConsumerEndpoint,
    ECControl,
    Endpoint,
    KVProtocol,
    Peers,
    PrefillEndpoint,
    ProxySettings,
    RoleBundle,
)
from epd_connectors.config.roles import Role
from epd_operator.api.model import Modality
from epd_operator.derive import ports, quantity
from epd_operator.render import meta, objects
from epd_operator.render.context import Context, Unit
from epd_operator.render.pod import PodParams, Probes, http_get, pod_template

PROXY_DEFAULT_REQUESTS: Final = {"cpu": "1", "memory": "1Gi"}
"""The proxy rewrites requests and forwards bytes; one CPU serves hundreds of requests per second."""


def proxy_bundle(ctx: Context, units: list[Unit]) -> RoleBundle:
    """Where the proxy sends work: each role's Service (each prefill pool's), on vLLM's HTTP port, with what
    the transfer connectors need from it per endpoint."""
    p2p_kv = ctx.spec.p2p_kv
    consumer_role = Role.PREFILL if ctx.spec.prefill is not None else Role.PD

    def host(unit: Unit) -> str:
        return ctx.names.host(unit.name)

    def http_port(unit: Unit) -> int:
        return ctx.vllm_http_port(unit)

    def ec(unit: Unit) -> ECControl | None:
        # The proxy tells each encoder which consumer pod to push to: pod IP + the control port of its TP rank 0,
        # which depends on the pool's TP size (DP is 1 per pod).
        if not ctx.spec.encoder.pushes_embeddings or unit.role != consumer_role:
            return None
        port = ctx.ec_port(unit)
        return ECControl(port=port, tensor_parallel_size=unit.tensor_parallel_size)

    def prefill(unit: Unit) -> PrefillEndpoint:
        # MooncakeConnector: the decode pulls from the prefill pod found through its bootstrap server.
        bootstrap = ctx.bootstrap_port(unit) if p2p_kv else None
        return PrefillEndpoint(host=host(unit), port=http_port(unit), ec=ec(unit), bootstrap_port=bootstrap)

    def of(role: Role) -> list[Unit]:
        return [u for u in units if u.role == role]

    own = next(u for u in units if u.role == Role.PROXY)
    check = ctx.spec.proxy.transfer_check
    settings = ProxySettings(
        port=ctx.port(own.name, ports.HTTP, ports.PROXY_PORT),
        encoder_affinity=ctx.spec.proxy.routing.encoder_affinity,
        kv_protocol=KVProtocol.MOONCAKE if p2p_kv else KVProtocol.PASSIVE,
        # A static roster (derive.site: the local runner) lists every instance in the peers.
        discover=not ctx.site.network.static_roster,
        canary_interval_s=float(check.interval_seconds) if check.enabled else 0.0,
        canary_timeout_s=float(check.timeout_seconds),
        canary_media=_canary_media(ctx.spec.model.modalities),
        media=ctx.spec.media.access,
        encoder_wake_s=_encoder_wake_s(ctx),
        **ctx.bind_host,
    )
    return RoleBundle(
        deployment=ctx.owner.name,
        namespace=ctx.owner.namespace,
        role=Role.PROXY,
        proxy=settings,
        peers=Peers(
            encoders=[Endpoint(host=host(u), port=http_port(u)) for u in of(Role.ENCODER)],
            prefill=[prefill(u) for u in of(Role.PREFILL)],
            decode=[Endpoint(host=host(u), port=http_port(u)) for u in of(Role.DECODE)],
            pd=[ConsumerEndpoint(host=host(u), port=http_port(u), ec=ec(u)) for u in of(Role.PD)],
        ),
    )


def _canary_media(modalities: list[Modality]) -> CanaryMedia | None:
    """An audio clip for a model that takes audio and no images; else the proxy's default, an image."""
    return "audio" if "image" not in modalities and "audio" in modalities else None


DISCOVERY_RULES: Final = [
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
]
"""All the proxy may do with the API: follow the EndpointSlices of its deployment's Services, and its model pods
for their revision labels (it pairs only instances of one model revision)."""


def render_proxy_rbac(ctx: Context, unit: Unit) -> list[dict[str, Any]]:
    """The proxy's ServiceAccount, a Role that reads EndpointSlices in this namespace, and their binding."""

    def metadata() -> dict[str, Any]:  # one dict per object: a caller may change one object's metadata
        return meta.metadata(ctx.owner, unit.name, unit.role)

    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata()},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(),
            "rules": [dict(rule) for rule in DISCOVERY_RULES],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": unit.name},
            "subjects": [{"kind": "ServiceAccount", "name": unit.name, "namespace": ctx.owner.namespace}],
        },
    ]


def render_proxy_deployment(ctx: Context, unit: Unit, bundle_json: str) -> dict[str, Any]:
    res = ctx.spec.proxy.resources
    requests = quantity.default_requests(res.requests, dict(PROXY_DEFAULT_REQUESTS), res.limits)
    resources: dict[str, Any] = {"requests": requests} if requests else {}
    if res.limits:
        resources["limits"] = dict(res.limits)
    params = PodParams(
        unit=unit,
        image=ctx.spec.images.proxy or ctx.defaults.proxy_image,
        bundle_json=bundle_json,
        ports={ports.HTTP: ports.PROXY_PORT},
        probes=Probes(
            readiness=http_get(PROXY_READINESS_PATH, ports.HTTP, period_s=5, failures=3),
            # Not /health: it is 503 until every role has a ready instance, and vLLM takes minutes to load.
            liveness=http_get(PROXY_LIVENESS_PATH, ports.HTTP, period_s=10, failures=6),
        ),
        resources=resources,
        node_selector=ctx.spec.proxy.node_selector,
    )
    template = pod_template(ctx, params)
    # The one pod that talks to the API server (EndpointSlices), under its own narrow ServiceAccount.
    template["spec"]["serviceAccountName"] = unit.name
    template["spec"]["automountServiceAccountToken"] = True
    return objects.render_deployment(ctx, unit, template)


def render_proxy_service(ctx: Context, unit: Unit) -> dict[str, Any]:
    """spec.proxy.service: its type, and its port mapped onto the proxy's listener."""
    service = ctx.spec.proxy.service
    return objects.render_service(ctx, unit, {ports.HTTP: service.port}, headless=False, service_type=service.type)


def _encoder_wake_s(ctx: Context) -> float:
    """Encoders that may scale to zero: how long the proxy holds a media request for one; 0 otherwise."""
    scaling = ctx.spec.encoder.autoscaling
    return float(scaling.hold_seconds) if scaling is not None and scaling.min_replicas == 0 else 0.0
