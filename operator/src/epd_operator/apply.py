"""Make the cluster hold exactly the desired children of one EPDDeployment: apply what is new, prune the rest.

Every write goes through server-side apply under the one field manager (`constants.FIELD_MANAGER`, forced),
so the operator owns exactly the fields it renders and a re-apply of identical content is a no-op on the
server (the resourceVersion stays the same). To spare the API server
those no-op requests too, `Applied` remembers what this process last applied: an object whose rendered
content is unchanged and whose fields we own are still ours (`managed_fields.held`) is not sent again. A
fresh process remembers nothing, so its first reconcile re-applies everything once, which also repairs drift
made while it was down; while it runs, the child watches (handlers) ask `Applied` whether an event shows
drift.

Server-side apply cannot undo one kind of hand edit: a new key in a keyed list (a Service port renumbered, a
container renamed) leaves our entry and theirs side by side, and the server refuses the result when the two
clash (two ports named "http"). `apply` then removes the other manager's entries from the lists we render
(`managed_fields.foreign_entries`) and applies again.

Pruning lists the children by label (`epd.serving.io/deployment=<name>` and managed-by) across the managed
kinds and deletes those not desired, but only ones whose controller owner reference is this very
EPDDeployment (uid), so a stray object that merely carries the labels is never deleted.

Nothing is ever applied over an object another EPDDeployment controls: before the first write of a sync, every
desired child the label listing did not find is read by name, and when one exists under another EPDDeployment's
controller reference, `sync` applies nothing at all and raises `NameConflictError` (see `conflicts`). Applying
it would take the object over (the same field manager owns it), and deleting the newcomer would then
garbage-collect the other deployment's object. Names are unique by construction (`derive.names.Names`), so this
guards against what a future name pattern or a hand-made object could still bring about. A caller that knows the
names are free skips the listing and the reads (`unclaimed`): the first sync of an EPDDeployment created while the
child watches ran, when they have shown no child of it and no object of its children's names (fifty deployments
created at once otherwise cost the API server 2,000 listings).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from epd_operator import _kube, managed_fields
from epd_operator.api import constants as c
from epd_operator.api.resource import Owner

KubeError = _kube.KubeError
"""Re-exported: callers of apply catch our own errors, never the client's."""


@dataclass(frozen=True)
class Kind:
    """A kind the operator creates or watches: enough to build its REST path."""

    api_version: str
    kind: str
    plural: str
    crd: bool = False
    """Served only where its CRD is installed (KEDA's): a listing answered 404 holds nothing, and an apply answered
    404 says which kind the cluster lacks (`MissingKindError`)."""

    def collection(self, namespace: str) -> str:
        return _kube.collection_path(self.api_version, self.plural, namespace)


MANAGED_KINDS: tuple[Kind, ...] = (
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Service", "services"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Kind("apps/v1", "StatefulSet", "statefulsets"),
    Kind("apps/v1", "DaemonSet", "daemonsets"),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
    Kind("keda.sh/v1alpha1", "ScaledObject", "scaledobjects", crd=True),
)
"""Every kind render produces; pruning lists exactly these (one request each, so no speculative kinds: a new
kind in render is added here, and `sync` refuses a desired object of a kind missing here)."""

_BY_KIND = {k.kind: k for k in MANAGED_KINDS}

WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet"})
AUTOSCALER_KINDS = frozenset({"HorizontalPodAutoscaler", "ScaledObject"})


class UnmanagedKindError(ValueError):
    """A desired object of a kind outside MANAGED_KINDS: it could be applied but never pruned."""


def kind_of(obj: dict[str, Any]) -> Kind:
    try:
        return _BY_KIND[obj["kind"]]
    except KeyError:
        raise UnmanagedKindError(
            f"kind {obj.get('kind')!r} is not managed; add it to epd_operator.apply.MANAGED_KINDS"
        ) from None


def key_of(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(kind, namespace, name): how children are matched between desired and live."""
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def fingerprint(obj: dict[str, Any]) -> str:
    """A digest of the rendered content: equal digests mean an apply would send the same thing."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class Record:
    """One child as this process last applied it."""

    digest: str
    """`fingerprint` of the rendered object sent."""
    held: str
    """`managed_fields.held` of the server's answer."""
    versions: frozenset[str]
    """resourceVersions our writes left behind: the answer's, and any a repair wrote on the way to it."""


def _version(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion"))


@dataclass
class Applied:
    """What this process last applied, by (kind, namespace, name)."""

    entries: dict[tuple[str, str, str], Record] = field(default_factory=dict)

    def unchanged(self, desired: dict[str, Any], digest: str, live: dict[str, Any] | None) -> bool:
        """Whether `live` is still as we left it after applying this very render (or shows a state our own
        writes passed through on the way there: the late event of a repair's first step)."""
        if live is None or live.get("metadata", {}).get("deletionTimestamp"):
            return False
        entry = self.entries.get(key_of(desired))
        if entry is None or entry.digest != digest:
            return False
        return entry.held == managed_fields.held(live) or _version(live) in entry.versions

    def record(self, desired: dict[str, Any], digest: str, answers: Sequence[dict[str, Any]]) -> None:
        """Remember the answers of one `apply` (the live object last)."""
        live = answers[-1]
        versions = frozenset(_version(a) for a in answers)
        self.entries[key_of(desired)] = Record(digest, managed_fields.held(live), versions)

    def forget(self, namespace: str, keys: Iterable[tuple[str, str, str]] | None = None) -> None:
        """Drop entries (all of a namespace when keys is None), e.g. when their EPDDeployment is gone."""
        doomed = list(keys) if keys is not None else [k for k in self.entries if k[1] == namespace]
        for key in doomed:
            self.entries.pop(key, None)


def _controller(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return next((ref for ref in refs if ref.get("controller")), None)


@dataclass(frozen=True)
class NameConflict:
    """A desired child whose name an object controlled by another EPDDeployment already has."""

    kind: str
    name: str
    holder: str
    """Name of the EPDDeployment controlling the object."""

    def __str__(self) -> str:
        return f"{self.kind} {self.name} belongs to EPDDeployment {self.holder}"


def conflicts(owner: Owner, existing: Iterable[dict[str, Any]]) -> list[NameConflict]:
    """The objects of `existing` (live objects named as `owner`'s desired children) that another EPDDeployment
    controls (pure).

    One of the same name but another uid is an earlier EPDDeployment of that name, deleted since (names are
    unique in a namespace): its leftovers are adopted, as an apply under our field manager always did.
    """
    found: list[NameConflict] = []
    for live in existing:
        ref = _controller(live)
        if ref is None or ref.get("kind") != c.KIND or str(ref.get("apiVersion", "")).split("/")[0] != c.GROUP:
            continue
        if ref.get("uid") != owner.uid and ref.get("name") != owner.name:
            found.append(NameConflict(live["kind"], live["metadata"]["name"], str(ref.get("name"))))
    return found


class NameConflictError(Exception):
    """`sync` found desired children another EPDDeployment holds, and wrote nothing."""

    def __init__(self, owner: Owner, found: Sequence[NameConflict]) -> None:
        self.found = list(found)
        self.keys = frozenset((x.kind, owner.namespace, x.name) for x in found)
        listed = "; ".join(str(x) for x in found)
        super().__init__(
            f"{listed}. Nothing of EPDDeployment {owner.name} was applied, and the other deployment is left as it "
            f"is. Fix: give this EPDDeployment (or the other) a name whose children's names differ"
        )


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    """The object less what others write without changing it: status (controllers), resourceVersion and
    managedFields (every write)."""
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in ("resourceVersion", "managedFields")}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}


def wrote(before: dict[str, Any] | None, answers: Sequence[dict[str, Any]]) -> bool:
    """Whether an apply changed the object (pure). Not the resourceVersion: a controller's status write between
    our listing and our apply moves it too, and a no-op would count as a write."""
    return before is None or len(answers) > 1 or _content(before) != _content(answers[-1])


@dataclass(frozen=True)
class SyncResult:
    """What one sync did, and the children as they are now."""

    written: list[tuple[str, str, str]]
    """Objects the server created or changed (a re-apply it found identical is not among them)."""
    sent: int
    """Apply requests made (written ones plus no-ops)."""
    skipped: int
    """Objects not sent because nothing changed since this process applied them."""
    deleted: list[tuple[str, str, str]]
    """Children pruned."""
    live: list[dict[str, Any]]
    """Every desired child as the server returned or listed it (workloads feed status)."""

    @property
    def changed(self) -> bool:
        return bool(self.written or self.deleted)


async def apply(
    client: _kube.Requester, obj: dict[str, Any], live: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Server-side apply of one object of any managed kind (forced, our field manager): the object as each
    write left it, the live one last.

    Given `live` (the object as last listed or watched), an apply the server refuses because another manager
    added entries to one of our keyed lists is sent again once those entries are gone (see the module doc):
    two writes, two answers. A workload that becomes autoscaled has its replicas handed over first
    (`releases_replicas`), one more write.
    """
    first = [await _hand_over_replicas(client, live)] if live is not None and releases_replicas(obj, live) else []
    try:
        return [*first, await _apply(client, obj)]
    except _kube.InvalidError:
        # Read whole: a watched `live` may be metadata only (the kinds status never reads).
        whole = await current(client, obj) if live is not None else None
        doomed = managed_fields.foreign_entries(whole, obj) if whole is not None else []
        if whole is None or not doomed:
            raise
        removed = await _remove(client, whole, doomed)
    return [*first, removed, await _apply(client, obj)]


REPLICAS: tuple[str, str] = ("spec", "replicas")


def releases_replicas(desired: dict[str, Any], live: dict[str, Any]) -> bool:
    """Whether this apply lets go of replicas we own (the role became autoscaled): a workload rendered without
    them whose live replicas are in our apply entry (pure)."""
    return (
        desired["kind"] in WORKLOAD_KINDS
        and "replicas" not in desired.get("spec", {})
        and managed_fields.owns(live, REPLICAS)
    )


async def _hand_over_replicas(client: _kube.Requester, live: dict[str, Any]) -> dict[str, Any]:
    """Let a second manager own the live replica count, so that our apply leaving it out keeps the count as it is
    (the autoscaler then takes it over) instead of resetting it."""
    meta = live["metadata"]
    handoff = {
        "apiVersion": live["apiVersion"],
        "kind": live["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": {"replicas": live["spec"]["replicas"]},
    }
    return await _server_side_apply(client, handoff, c.REPLICAS_HANDOFF_MANAGER)


def _object_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{kind_of(obj).collection(meta['namespace'])}/{meta['name']}"


async def _server_side_apply(client: _kube.Requester, obj: dict[str, Any], manager: str) -> dict[str, Any]:
    """One forced server-side apply of `obj` under `manager`."""
    query = {"fieldManager": manager, "force": "true"}
    return await client.request("PATCH", _object_path(obj), query=query, body=obj, content_type=_kube.APPLY_PATCH)


async def current(client: _kube.Requester, obj: dict[str, Any]) -> dict[str, Any] | None:
    """`obj` as the server holds it now; None when it does not exist.

    Read through a list selecting the name: the operator's role grants list and watch on children, not get."""
    meta = obj["metadata"]
    items = await _list(client, kind_of(obj), meta["namespace"], {"fieldSelector": f"metadata.name={meta['name']}"})
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], **items[0]} if items else None


async def _list(client: _kube.Requester, kind: Kind, namespace: str, query: dict[str, str]) -> list[dict[str, Any]]:
    """The items of one filtered listing; none of a CRD kind the cluster does not serve."""
    try:
        listed = await client.request("GET", kind.collection(namespace), query=query)
    except _kube.NotFoundError:
        if kind.crd:
            return []
        raise
    items: list[dict[str, Any]] = listed.get("items") or []
    return items


async def _remove(client: _kube.Requester, live: dict[str, Any], pointers: Sequence[str]) -> dict[str, Any]:
    """One JSON patch removing `pointers` from `live`, refused if the object changed since (indices move)."""
    meta = live["metadata"]
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion", "value": meta["resourceVersion"]}]
    ops += [{"op": "remove", "path": pointer} for pointer in pointers]
    return await client.request(
        "PATCH",
        _object_path(live),
        query={"fieldManager": c.FIELD_MANAGER},
        body=ops,
        content_type=_kube.JSON_PATCH,
    )


async def _apply(client: _kube.Requester, obj: dict[str, Any]) -> dict[str, Any]:
    kind = kind_of(obj)
    try:
        return await _server_side_apply(client, obj, c.FIELD_MANAGER)
    except _kube.NotFoundError as exc:
        # An apply creates what is missing, so a 404 names something not there yet: the kind itself (a CRD not
        # installed), or a RoleBinding's Role missing from the API server's cache for its escalation check.
        if kind.crd:
            raise MissingKindError(kind, exc) from exc
        raise RetryableNotFoundError(exc.method, exc.path, exc.status, exc.reason, exc.message) from exc


class RetryableNotFoundError(_kube.NotFoundError):
    """404 answered to an apply (see `apply`): retried with backoff."""

    retryable = True


class MissingKindError(RetryableNotFoundError):
    """The cluster serves no such kind (its CRD is not installed); retried, so installing it later is picked up."""

    def __init__(self, kind: Kind, exc: _kube.KubeError) -> None:
        message = (
            f"the cluster serves no {kind.api_version} {kind.kind} (its CRD is not installed). Fix: install KEDA, "
            "or set the role's autoscaling.engine to hpa"
        )
        super().__init__(exc.method, exc.path, exc.status, exc.reason, message)


def selector(owner_name: str) -> str:
    """The label selector of one EPDDeployment's children."""
    return f"{c.LABEL_DEPLOYMENT}={owner_name},{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"


async def list_children(
    client: _kube.Requester, namespace: str, owner_name: str, kinds: Sequence[Kind] = MANAGED_KINDS
) -> list[dict[str, Any]]:
    """Every object of the managed kinds carrying the deployment's labels (one list request per kind)."""

    async def one(kind: Kind) -> list[dict[str, Any]]:
        items = await _list(client, kind, namespace, {"labelSelector": selector(owner_name)})
        for item in items:  # list items carry no apiVersion/kind
            item.setdefault("apiVersion", kind.api_version)
            item.setdefault("kind", kind.kind)
        return items

    found: list[dict[str, Any]] = []
    for items in await asyncio.gather(*(one(k) for k in kinds)):
        found.extend(items)
    return found


def _controlled_by(obj: dict[str, Any], uid: str) -> bool:
    ref = _controller(obj)
    return ref is not None and ref.get("uid") == uid


async def delete(client: _kube.Requester, obj: dict[str, Any]) -> None:
    """Delete one object (its own dependents, e.g. pods, are then collected in the background)."""
    kind = kind_of(obj)
    meta = obj["metadata"]
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
    if meta.get("uid"):  # never delete a same-named object created since we listed
        body["preconditions"] = {"uid": meta["uid"]}
    # NotFound: already gone; Conflict: replaced by a new object since we listed, not ours to judge here.
    with contextlib.suppress(_kube.NotFoundError, _kube.ConflictError):
        await client.request("DELETE", f"{kind.collection(meta['namespace'])}/{meta['name']}", body=body)


_FOLLOWS = {"RoleBinding": "Role"}
"""A RoleBinding sent with its Role may arrive first: without the `bind` verb the operator may bind only rules
it holds, and the API server cannot check a Role that does not exist yet (404)."""


def _batches(objects: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Consecutive workloads form one batch, and so do consecutive other objects (each batch sent at once): the
    workloads start together, after the ConfigMaps and Services they use and before their autoscalers. A
    RoleBinding starts a batch after its Role's."""
    batches: list[list[dict[str, Any]]] = []
    for obj in objects:
        after = _FOLLOWS.get(obj["kind"])
        if (
            not batches
            or (obj["kind"] in WORKLOAD_KINDS) != (batches[-1][-1]["kind"] in WORKLOAD_KINDS)
            or (after is not None and any(o["kind"] == after for o in batches[-1]))
        ):
            batches.append([obj])
        else:
            batches[-1].append(obj)
    return batches


async def sync(
    client: _kube.Requester,
    owner: Owner,
    objects: Sequence[dict[str, Any]],
    memory: Applied,
    *,
    unclaimed: bool = False,
) -> SyncResult:
    """Apply `objects` (skipping ones unchanged since this process applied them), then prune the rest.
    Raises NameConflictError, having written nothing, when another EPDDeployment holds one of the names.
    `unclaimed`: the caller knows that no child of `owner` and no object of these names exists (module doc)."""
    for obj in objects:
        kind_of(obj)  # refuse an unmanaged kind before writing anything
    listed: dict[tuple[str, str, str], dict[str, Any]] = {}
    if not unclaimed:
        listed = {key_of(o): o for o in await list_children(client, owner.namespace, owner.name)}
        # Only the names the listing lacks can belong to someone else (ours carry our labels): one read each,
        # so a reconcile of existing children costs nothing more.
        unlisted = await asyncio.gather(*(current(client, o) for o in objects if key_of(o) not in listed))
        found = conflicts(owner, [*listed.values(), *(o for o in unlisted if o is not None)])
        if found:
            raise NameConflictError(owner, found)
    live: dict[tuple[str, str, str], dict[str, Any]] = {}
    written: list[tuple[str, str, str]] = []
    sent = 0

    async def one(obj: dict[str, Any]) -> None:
        nonlocal sent
        key, digest = key_of(obj), fingerprint(obj)
        before = listed.get(key)
        if before is not None and memory.unchanged(obj, digest, before):
            live[key] = before
            return
        answers = await apply(client, obj, before)
        after = answers[-1]
        sent += 1
        memory.record(obj, digest, answers)
        live[key] = after
        if wrote(before, answers):
            written.append(key)

    for batch in _batches(objects):
        await asyncio.gather(*(one(o) for o in batch))
    wanted = {key_of(o) for o in objects}
    doomed = [o for k, o in listed.items() if k not in wanted and _controlled_by(o, owner.uid)]
    await asyncio.gather(*(delete(client, o) for o in doomed))
    memory.forget(owner.namespace, [key_of(o) for o in doomed])
    skipped = len(objects) - sent
    return SyncResult(written, sent, skipped, [key_of(o) for o in doomed], [live[key_of(o)] for o in objects])
