"""From a Service's EndpointSlices to the instances behind it, and from the model pods to their revisions (pure;
the watching is in `discovery`).

A Service name load-balances over its pods, but the proxy must pick pods itself (least outstanding, hashing
by uuid) and must name the exact pod an encoder pushes to, so it reads the pod addresses from the Service's
EndpointSlices. Slices come in as the API's JSON (camelCase dicts), so this module needs no client library.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from epd_connectors.config import base
from epd_connectors.config.bundle import DEPLOYMENT_LABEL, MODEL_REVISION_LABEL, ECControl
from epd_connectors.config.roles import Role
from epd_connectors.proxy.roster import InstanceSpec, PodRevision

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""The label every EndpointSlice of a Service carries (the watch selects on it)."""


@dataclass(frozen=True)
class RoleWatch:
    """One role's Service and how to address its pods."""

    role: Role
    service: str
    port: int | None = None
    """The port to use when a slice lists several: matched by number (None: the only or first port)."""
    port_name: str | None = None
    """Or matched by name, which wins over `port`."""
    ec: ECControl | None = None
    """EC consumers with a push connector: how their pods' control ports are laid out (the bundle's endpoint)."""
    bootstrap_port: int | None = None
    """Prefill with MooncakeConnector: VLLM_MOONCAKE_BOOTSTRAP_PORT."""


def _port_of(slice_: Mapping[str, Any], watch: RoleWatch) -> int | None:
    ports = [p for p in slice_.get("ports") or [] if isinstance(p, Mapping) and isinstance(p.get("port"), int)]
    if watch.port_name is not None:
        named = [p["port"] for p in ports if p.get("name") == watch.port_name]
        return named[0] if named else None
    if watch.port is not None:
        numbered = [p["port"] for p in ports if p["port"] == watch.port]
        if numbered:
            return watch.port
    return ports[0]["port"] if ports else None


def _usable(endpoint: Mapping[str, Any]) -> bool:
    """Ready, or readiness unknown (the API says to treat a missing `ready` as ready); never terminating."""
    conditions = endpoint.get("conditions") or {}
    if conditions.get("terminating") is True:
        return False
    return conditions.get("ready") is not False


def specs_from_slices(slices: Iterable[Mapping[str, Any]], watch: RoleWatch) -> list[InstanceSpec]:
    """The instances of one role from all of its Service's slices, sorted, each address once."""
    found: dict[str, InstanceSpec] = {}
    for slice_ in slices:
        labels = (slice_.get("metadata") or {}).get("labels") or {}
        if labels.get(SERVICE_NAME_LABEL) not in (None, watch.service):
            continue
        if slice_.get("addressType") == "FQDN":
            continue
        port = _port_of(slice_, watch)
        if port is None:
            continue
        for endpoint in slice_.get("endpoints") or []:
            if not isinstance(endpoint, Mapping) or not _usable(endpoint):
                continue
            for address in endpoint.get("addresses") or []:
                url = base.address("http", address, port)
                ec = tuple(watch.ec.addresses(address)) if watch.ec is not None else ()
                bootstrap = base.address("http", address, watch.bootstrap_port) if watch.bootstrap_port else None
                found[url] = InstanceSpec(url, ec, bootstrap, _pod_name(endpoint))
    return [found[url] for url in sorted(found)]


def _pod_name(endpoint: Mapping[str, Any]) -> str:
    ref = endpoint.get("targetRef")
    if isinstance(ref, Mapping) and ref.get("kind") == "Pod" and isinstance(ref.get("name"), str):
        return str(ref["name"])
    return ""


def apply_event(objects: dict[str, Mapping[str, Any]], event_type: str, obj: Mapping[str, Any]) -> None:
    """Keep `objects` (name -> slice or pod) current with one watch event (ADDED, MODIFIED, DELETED)."""
    name = str((obj.get("metadata") or {}).get("name", ""))
    if event_type == "DELETED":
        objects.pop(name, None)
    elif event_type in ("ADDED", "MODIFIED"):
        objects[name] = obj


def model_pod_selector(deployment: str) -> str:
    """The label selector of a deployment's model pods (encoder, prefill, decode, PD): those with a revision."""
    return f"{DEPLOYMENT_LABEL}={deployment},{MODEL_REVISION_LABEL}"


def revisions_from_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, PodRevision]:
    """Pod name -> its model revision and creation time, for the pods that carry a revision."""
    found: dict[str, PodRevision] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        revision = (meta.get("labels") or {}).get(MODEL_REVISION_LABEL)
        if isinstance(revision, str) and revision and isinstance(meta.get("name"), str):
            found[meta["name"]] = PodRevision(revision, str(meta.get("creationTimestamp") or ""))
    return found
