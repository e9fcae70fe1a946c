"""The operator's requests besides the children's applies (module apply): an EPDDeployment's status and whether it
still exists, and a pod's revision gate. Paths are built here and nowhere else; errors are `_kube`'s, mapped
once in `Client.request`.
"""

from __future__ import annotations

from typing import Any

from epd_operator import _kube, status
from epd_operator.api import constants as c
from epd_operator.api.status import EPDDeploymentStatus


def _deployment_path(namespace: str, name: str) -> str:
    return _kube.collection_path(c.API_VERSION, c.PLURAL, namespace) + f"/{name}"


async def write_status(client: _kube.Requester, namespace: str, name: str, new: EPDDeploymentStatus) -> bool:
    """Replace the whole status (one request to the status subresource); False when the object is gone.

    A JSON patch `add /status` replaces it wholesale, so keys that disappeared (a role removed) do not linger
    as they would under a merge patch.
    """
    patch = [{"op": "add", "path": "/status", "value": status.to_json(new)}]
    try:
        await client.request(
            "PATCH", _deployment_path(namespace, name) + "/status", body=patch, content_type=_kube.JSON_PATCH
        )
    except _kube.NotFoundError:
        return False
    return True


async def deployment_exists(client: _kube.Requester, namespace: str, name: str, uid: str) -> bool:
    """Whether this very EPDDeployment (same uid) still exists and is not being deleted."""
    try:
        meta = (await client.request("GET", _deployment_path(namespace, name))).get("metadata", {})
    except _kube.NotFoundError:
        return False
    return bool(meta.get("uid") == uid and not meta.get("deletionTimestamp"))


async def patch_pod_status(client: _kube.Requester, namespace: str, name: str, patch: dict[str, Any]) -> None:
    """A strategic merge patch of a pod's status (conditions merge by type, so the kubelet's stay)."""
    path = _kube.collection_path("v1", "pods", namespace) + f"/{name}/status"
    await client.request("PATCH", path, body=patch, content_type=_kube.STRATEGIC_MERGE_PATCH)
