"""The operator's own watches of its children and model pods: list, then watch from the list's version, as an
informer does; every event goes to a callback (the controller's, which keeps it and enqueues the deployment).

kopf watches the EPDDeployments (its handlers, its peering); the children and the model pods come here. Their
events only enqueue a deployment, and kopf's per-event machinery (a worker per object, a handler's bookkeeping)
was a quarter of the operator's CPU with fifty deployments coming up at once. The kinds status never reads come
as metadata only (PartialObjectMetadata): a repair compares managedFields and versions, not bodies.

The scope is kopf's: the whole cluster, namespaces by name, or namespace patterns (kopf's syntax, `matches`),
which a watch of the namespaces resolves, starting and stopping their streams as namespaces come and go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import Any

from epd_operator import _kube, apply

log = logging.getLogger(__name__)

Deliver = Callable[[str | None, dict[str, Any]], None]
"""(event type, None for a listed object; the object): what a stream hands on."""

WATCH_S = 300
"""The server ends a watch after about this long (timeoutSeconds, jittered); it is opened again from the last
version, with no listing."""
RETRY_S = (1.0, 30.0)
"""A failed listing or watch is tried again after the first, doubling up to the second."""
ABSENT_RETRY_S = 10.0
"""A kind whose CRD the cluster does not serve (KEDA's, before it is installed) is listed again this often."""

METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
NAMESPACES = apply.Kind("v1", "Namespace", "namespaces")
"""What a watch of namespace patterns follows (not a kind the operator creates)."""
_KEPT_META = ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences", "deletionTimestamp")


@dataclass(frozen=True)
class Source:
    """One kind to follow in every namespace of the scope."""

    kind: apply.Kind
    """A kind served only where its CRD is installed (`crd`) is listed again every `ABSENT_RETRY_S` while absent."""
    selector: str
    """Server-side label selector: only what is ours comes."""
    deliver: Deliver
    metadata_only: bool = False


@dataclass
class Known:
    """What one stream has shown and not seen go, by (namespace, name), as a stub: the metadata a DELETED event
    carries. A new listing is compared with it, so an object deleted while the stream was down is still
    delivered as deleted (pure)."""

    stubs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def seen(self, event_type: str | None, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        if event_type == "DELETED":
            self.stubs.pop(key, None)
        else:
            self.stubs[key] = stub(obj)

    def listed(self, items: Iterable[dict[str, Any]]) -> list[tuple[str | None, dict[str, Any]]]:
        """A fresh listing's events: every item as listed, then each known object missing from it as deleted."""
        events: list[tuple[str | None, dict[str, Any]]] = [(None, item) for item in items]
        present = {_key(obj) for _, obj in events}
        events += [("DELETED", gone) for key, gone in self.stubs.items() if key not in present]
        for event_type, obj in events:
            self.seen(event_type, obj)
        return events


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def stub(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The identity and ownership of an object, what a deletion needs of it."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in _KEPT_META if k in meta}}


def matches(namespace: str, pattern: str) -> bool:
    """Whether `namespace` matches one of kopf's namespace patterns, as kopf decides: comma-separated globs, the
    first inclusive (a leading `!` glob implies a `*` before it); an exclusion `!glob` takes a match away, a later
    inclusive glob gives it back only to a namespace the first glob matched."""
    globs = [glob.strip() for glob in pattern.split(",")]
    if globs[0].startswith("!"):
        globs.insert(0, "*")
    matched = first = fnmatch(namespace, globs[0])
    for glob in globs[1:]:
        if glob.startswith("!"):
            matched = matched and not fnmatch(namespace, glob.lstrip("!"))
        else:
            matched = matched or (first and fnmatch(namespace, glob))
    return matched


def is_literal(pattern: str) -> bool:
    """A namespace name, not a pattern (as kopf decides: no `!`, `*`, `?` or `,`)."""
    return not any(ch in pattern for ch in "!*?,")


class Watches:
    """Every source followed in every namespace of the scope; `listed(namespace)` is called once all sources of
    a namespace (None: the whole cluster) have listed, and `gone(namespace)` when a watched namespace went."""

    def __init__(
        self,
        client: _kube.Client,
        sources: Iterable[Source],
        *,
        listed: Callable[[str | None], None],
        gone: Callable[[str], None],
    ) -> None:
        self.client, self.sources = client, tuple(sources)
        self.listed, self.gone = listed, gone
        self.tasks: dict[str | None, list[asyncio.Task[None]]] = {}
        self.namespace_task: asyncio.Task[None] | None = None

    def start(self, namespaces: Iterable[str], all_namespaces: bool) -> None:
        patterns = tuple(namespaces)
        if all_namespaces:
            self._follow_namespace(None)
        elif all(is_literal(p) for p in patterns):
            for name in patterns:
                self._follow_namespace(name)
        else:
            source = Source(NAMESPACES, "", self._namespace_event(patterns), metadata_only=True)
            self.namespace_task = asyncio.create_task(follow(self.client, source, None, lambda: None))

    def _namespace_event(self, patterns: tuple[str, ...]) -> Deliver:
        def seen(event_type: str | None, obj: dict[str, Any]) -> None:
            name = obj["metadata"].get("name", "")
            if event_type == "DELETED":
                for task in self.tasks.pop(name, []):
                    task.cancel()
                self.gone(name)
            elif name not in self.tasks and any(matches(name, p) for p in patterns):
                self._follow_namespace(name)

        return seen

    def _follow_namespace(self, namespace: str | None) -> None:
        waiting = set(range(len(self.sources)))

        def listed_one(index: int) -> Callable[[], None]:
            def done() -> None:
                if index in waiting:
                    waiting.discard(index)
                    if not waiting:
                        self.listed(namespace)

            return done

        self.tasks[namespace] = [
            asyncio.create_task(follow(self.client, s, namespace, listed_one(i)), name=f"watch {s.kind.plural}")
            for i, s in enumerate(self.sources)
        ]

    async def close(self) -> None:
        tasks = [t for ts in self.tasks.values() for t in ts]
        if self.namespace_task is not None:
            tasks.append(self.namespace_task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def follow(client: _kube.Client, source: Source, namespace: str | None, listed: Callable[[], None]) -> None:
    """List, then watch from the listing's version until the server says it is too old (410), forever; each
    object goes to `source.deliver`; `listed` is called after every listing."""
    path = _kube.collection_path(source.kind.api_version, source.kind.plural, namespace)
    where = namespace or "every namespace"
    known, delay = Known(), RETRY_S[0]
    while True:
        try:
            version = await _list(client, source, path, known)
            listed()
            if version is None:
                await asyncio.sleep(ABSENT_RETRY_S)
                continue
            delay = RETRY_S[0]
            await _watch(client, source, path, version, known)
            continue  # the version was too old: list again at once
        except _kube.KubeError as exc:
            log.warning("watch of %s in %s: %s; again in %.0f s", source.kind.plural, where, exc, delay)
        except Exception:  # a stream that stopped would leave its children unrepaired: log, and go on
            log.exception("watch of %s in %s failed; again in %.0f s", source.kind.plural, where, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, RETRY_S[1])


async def _list(client: _kube.Client, source: Source, path: str, known: Known) -> str | None:
    """One listing, delivered; its version, None when the kind is not served (what was known is gone)."""
    query = {"labelSelector": source.selector} if source.selector else {}
    accept = METADATA_LIST if source.metadata_only else _kube.JSON
    try:
        answer = await client.request("GET", path, query=query, accept=accept)
    except _kube.NotFoundError:
        if not source.kind.crd:
            raise
        answer = {"items": [], "metadata": {}}
    for event_type, obj in known.listed(answer.get("items") or []):
        source.deliver(event_type, obj)
    version = (answer.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


async def _watch(client: _kube.Client, source: Source, path: str, version: str, known: Known) -> None:
    """Watch from `version`, again each time the server ends a watch, until the version is too old (410)."""
    accept = METADATA_ONLY if source.metadata_only else _kube.JSON
    while True:
        seconds = int(WATCH_S * random.uniform(1.0, 1.2))
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": version,
            "timeoutSeconds": str(seconds),
        }
        if source.selector:
            query["labelSelector"] = source.selector
        async for event in client.watch(path, query, accept=accept, idle_s=seconds + 30):
            event_type, obj = event.get("type"), event.get("object") or {}
            if event_type == "ERROR":
                if obj.get("code") == 410:
                    return  # too old: list again
                raise _kube.KubeError("WATCH", path, int(obj.get("code") or 0), str(obj.get("reason")), str(obj))
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if event_type in ("ADDED", "MODIFIED", "DELETED"):
                known.seen(event_type, obj)
                source.deliver(event_type, obj)
