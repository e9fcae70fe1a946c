"""Opening model pods' revision-ready gates (module revision_gate decides which): the pod watch's shell.

Each model pod event updates what the operator knows of its deployment's model pods, then every gate the
decision opens gets one status patch. A failed patch is logged and left: the pod's next event (the kubelet
reports it as its containers come up) tries again.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import replace
from typing import Any

from epd_operator import _kube
from epd_operator.api import constants as c
from epd_operator.revision_gate import gates_to_open, model_pod, model_roles, open_gate_patch
from epd_operator.state import State, Tracked

log = logging.getLogger(__name__)


def pod_event(state: State, event_type: str | None, pod: dict[str, Any]) -> Tracked | None:
    """Remember (or forget) one model pod; the deployment it belongs to, when the operator tracks it. Kept by
    its deployment's label even before that deployment is tracked (a restarted operator's pod listing may come
    first): a pod whose containers are up while its gate is closed sends no further event, so the reconcile
    that follows must find it."""
    meta = pod.get("metadata") or {}
    facts = model_pod(pod)
    deployment = (meta.get("labels") or {}).get(c.LABEL_DEPLOYMENT)
    if facts is None or not deployment:
        return None
    pods = state.model_pods.setdefault((meta.get("namespace", ""), deployment), {})
    known = pods.pop(facts.name, None)
    if event_type != "DELETED":
        # An event from before our patch may still show the gate closed; gates never close, so it stays open.
        pods[facts.name] = replace(facts, gate_open=True) if known is not None and known.gate_open else facts
    return state.owner_of(meta)


async def open_gates(state: State, tracked: Tracked) -> None:
    """Open every gate the last render and the known pods call for."""
    if tracked.desired is None:
        return  # not rendered yet: the reconcile calls again
    pods = state.model_pods.get(tracked.key, {})
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for pod in gates_to_open(pods.values(), model_roles(tracked.desired.workloads)):
        path = f"/api/v1/namespaces/{tracked.owner.namespace}/pods/{pod.name}/status"
        try:
            await state.client.request(
                "PATCH", path, body=open_gate_patch(pod, now), content_type=_kube.STRATEGIC_MERGE_PATCH
            )
        except _kube.NotFoundError:
            pods.pop(pod.name, None)
            continue
        except _kube.KubeError as exc:
            log.warning("%s/%s: cannot open the revision gate of pod %s: %s", *tracked.key, pod.name, exc)
            continue
        pods[pod.name] = replace(pod, gate_open=True)
        log.info("%s/%s: pod %s takes traffic (revision %s is complete)", *tracked.key, pod.name, pod.revision)
