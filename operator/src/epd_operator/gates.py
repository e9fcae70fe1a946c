"""The gate step of a reconcile pass: open the revision-ready gates of the model pods that module revision_gate
says may take traffic, one status patch each. A failed patch is logged and left: the pod's next event (the kubelet
reports it as its containers come up) brings another pass.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import replace

from epd_operator import _kube, calls
from epd_operator.revision_gate import gates_to_open, model_roles, open_gate_patch
from epd_operator.runtime import Runtime
from epd_operator.state import DeploymentState

log = logging.getLogger(__name__)


async def open_gates(rt: Runtime, state: DeploymentState) -> DeploymentState:
    """Open every gate the last applied render and the known pods call for."""
    if state.desired is None:
        return state  # nothing applied yet: the pass that applies calls again
    pods = rt.world.model_pods.get(state.key, {})
    known = [replace(p, gate_open=True) if p.name in state.opened_gates else p for p in pods.values()]
    opened = frozenset(name for name in state.opened_gates if name in pods)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for pod in gates_to_open(known, model_roles(state.desired.workloads)):
        try:
            await calls.patch_pod_status(rt.client, state.owner.namespace, pod.name, open_gate_patch(pod, now))
        except _kube.NotFoundError:
            continue  # gone; its DELETED event follows
        except _kube.KubeError as exc:
            log.warning("%s/%s: cannot open the revision gate of pod %s: %s", *state.key, pod.name, exc)
            continue
        opened |= {pod.name}
        log.info("%s/%s: pod %s takes traffic (revision %s is complete)", *state.key, pod.name, pod.revision)
    return replace(state, opened_gates=opened)
