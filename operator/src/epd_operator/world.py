"""What the watches and the readers saw, kept for the reconcile pass to read (an informer cache).

The watches write here and enqueue the deployment; only the pass acts on it. Per EPDDeployment: its body as last
seen, the children that changed or went since the last pass (for drift repairs), its model pods (for revision
gates) and the last reading of its master and proxy; per workload: its last state, for status; per child: the
deployment it belongs to, so a new deployment's first apply knows its names are free without a listing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from epd_operator import apply
from epd_operator.api import constants as c
from epd_operator.revision_gate import ModelPod, model_pod

Key = tuple[str, str]
"""(namespace, name) of an EPDDeployment."""
ChildKey = tuple[str, str, str]
"""(kind, namespace, name) of a child, as `apply.key_of` makes it."""


def owner_key(meta: Mapping[str, Any]) -> Key | None:
    """The EPDDeployment a child or pod belongs to: its controller, or (reference removed by hand) its label."""
    namespace = meta.get("namespace", "")
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == c.KIND:
            return namespace, ref.get("name", "")
    name = (meta.get("labels") or {}).get(c.LABEL_DEPLOYMENT)
    return (namespace, name) if name else None


def controller_uid(meta: Mapping[str, Any]) -> str | None:
    """The uid of the EPDDeployment controlling a child; None when no reference says."""
    refs = meta.get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller") and r.get("kind") == c.KIND), None)


KEPT_KINDS = apply.WORKLOAD_KINDS | apply.AUTOSCALER_KINDS
"""The kinds status reads: workloads and their autoscalers."""


def trim(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a workload (or an autoscaler) status reads (a watch body holds the whole pod template)."""
    meta = body.get("metadata", {})
    return {
        "metadata": {k: meta[k] for k in ("name", "uid", "generation", "deletionTimestamp") if k in meta},
        "spec": {"replicas": (body.get("spec") or {}).get("replicas", 1)},
        "status": dict(body.get("status") or {}),
    }


@dataclass
class World:
    """The caches, by key."""

    deployments: dict[Key, dict[str, Any]] = field(default_factory=dict)
    """Each EPDDeployment as its watch last showed it."""
    workloads: dict[ChildKey, dict[str, Any]] = field(default_factory=dict)
    """Each workload child, and each autoscaler, as last seen (`trim`med)."""
    touched: dict[Key, dict[ChildKey, dict[str, Any] | None]] = field(default_factory=dict)
    """Per EPDDeployment, the children seen since its last pass: the newest body, None when deleted."""
    model_pods: dict[Key, dict[str, ModelPod]] = field(default_factory=dict)
    """Per EPDDeployment, its model pods by name (kept even before the deployment is seen: a restarted operator's
    pod listing may come first, and a pod whose containers are up while its gate is closed sends no more events)."""
    readings: dict[tuple[Key, str], Any] = field(default_factory=dict)
    """(deployment, "store" or "transfers") -> the last reading of its master or proxy (module polling)."""
    children: dict[ChildKey, Key | None] = field(default_factory=dict)
    """Every child the watches have shown and not seen go, with the EPDDeployment it belongs to: which names are
    taken, without asking the API server (`unclaimed`)."""
    created: set[Key] = field(default_factory=set)
    """The EPDDeployments this process saw created (a watch's ADDED event, not its first listing)."""
    listed: set[str | None] = field(default_factory=set)
    """The namespaces whose child watches have all listed once (None: the whole cluster's): `children` holds
    every child there."""

    def remember(self, key: ChildKey, body: Mapping[str, Any], *, watched: bool) -> None:
        """Keep the newest state of child `key` if it is a workload (status reads no other kind).

        The watch and our own apply answers race, either may arrive late. The generation orders them (it only
        grows for one uid): a watch event wins ties, since it carries the latest status; an apply or list answer
        counts only when it shows a generation not seen yet.
        """
        if key[0] not in KEPT_KINDS:
            return
        old = self.workloads.get(key)
        new_meta = body.get("metadata", {})
        if old is not None and old["metadata"].get("uid") == new_meta.get("uid"):
            before, after = int(old["metadata"].get("generation") or 0), int(new_meta.get("generation") or 0)
            if after < before or (after == before and not watched):
                return
        self.workloads[key] = trim(body)

    def child_seen(self, deleted: bool, key: ChildKey, body: dict[str, Any], owners: list[Key]) -> None:
        """A child's watch event: its workload state, whether its name is taken, and a touch for each deployment
        that may act on it."""
        if deleted:
            self.children.pop(key, None)
        else:
            self.children[key] = owners[0] if owners else None
        if key[0] in KEPT_KINDS:
            if not deleted:
                self.remember(key, body, watched=True)
            elif self.workloads.get(key, {}).get("metadata", {}).get("uid") == body.get("metadata", {}).get("uid"):
                del self.workloads[key]
        for owner in owners:
            self.touched.setdefault(owner, {})[key] = None if deleted else body

    def pod_seen(self, deleted: bool, pod: Mapping[str, Any]) -> Key | None:
        """A model pod's watch event; the deployment it belongs to (None: not a model pod of ours)."""
        meta = pod.get("metadata") or {}
        facts = model_pod(pod)
        deployment = (meta.get("labels") or {}).get(c.LABEL_DEPLOYMENT)
        if facts is None or not deployment:
            return None
        key = (meta.get("namespace", ""), deployment)
        pods = self.model_pods.setdefault(key, {})
        known = pods.pop(facts.name, None)
        if not deleted:
            # An event from before our patch may still show the gate closed; gates never close, so it stays open.
            pods[facts.name] = replace(facts, gate_open=True) if known is not None and known.gate_open else facts
        return key

    def unclaimed(self, key: Key, names: Iterable[ChildKey]) -> bool:
        """Whether deployment `key` was created while the child watches ran, they have listed its namespace, and
        they have shown no child of it and no object of `names` (its desired children): its first apply needs no
        listing."""
        if key not in self.created or not {None, key[0]} & self.listed:
            return False
        if any(name in self.children for name in names):
            return False
        return key not in self.children.values()

    def take_touched(self, key: Key) -> dict[ChildKey, dict[str, Any] | None]:
        return self.touched.pop(key, {})

    def forget(self, key: Key) -> None:
        """The EPDDeployment is gone: everything kept for it (its workloads go through their own events)."""
        self.deployments.pop(key, None)
        self.created.discard(key)
        self.touched.pop(key, None)
        self.model_pods.pop(key, None)
        for slot in ("store", "transfers"):
            self.readings.pop((key, slot), None)
