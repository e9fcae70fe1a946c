"""Names shared by every layer: the API group, label and annotation keys, condition types, the field manager.

Named once here so that a label written by render and read by status can never drift apart.
"""

from __future__ import annotations

from typing import Final

from epd_connectors.config.bundle import DEPLOYMENT_LABEL, MODEL_REVISION_LABEL

GROUP: Final = "epd.serving.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "EPDDeployment"
PLURAL: Final = "epddeployments"
SINGULAR: Final = "epddeployment"
SHORT_NAMES: Final = ("epd",)

FIELD_MANAGER: Final = "epd-operator"
"""The one server-side-apply field manager for everything the operator writes."""
REPLICAS_HANDOFF_MANAGER: Final = "epd-operator-replicas-handoff"
"""Holds a workload's replicas for the moment the operator lets go of them to an autoscaler: without a second
owner, an apply that leaves out a field only we own resets it (a Deployment to 1 replica)."""

# Recommended labels (kubernetes.io/docs/concepts/overview/working-with-objects/common-labels) plus our role.
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_VERSION: Final = "app.kubernetes.io/version"
LABEL_ROLE: Final = f"{GROUP}/role"
LABEL_DEPLOYMENT: Final = DEPLOYMENT_LABEL
"""Selects every child of one EPDDeployment (value: its name); used by the NetworkPolicy, status and the proxy."""
LABEL_POOL: Final = f"{GROUP}/pool"
"""On prefill workloads and pods: the prefill pool ("main" or an additionalPools name), so pools have
distinct selectors."""

LABEL_MODEL_REVISION: Final = MODEL_REVISION_LABEL
"""On encoder, prefill, decode and PD pods (status.modelRevision): a model change rolls every vLLM role, and pods
of different weights can be told apart."""
CONDITION_REVISION_READY: Final = f"{GROUP}/revision-ready"
"""The readiness gate of encoder, prefill, decode and PD pods: the operator sets it True once every model role has
a pod of the pod's revision with its containers ready, so a new revision takes traffic as a whole set and the
old pods (which the workloads delete only as new ones become Ready) serve until then."""
VLLM_DRAIN_DELAY_S: Final = 10
"""A vLLM pod keeps serving this long after it is deleted (a preStop sleep), until the EndpointSlices and the
proxy's roster have dropped it; a roll deletes the old set's pods the moment the new set turns Ready."""
VLLM_SHUTDOWN_TIMEOUT_S: Final = 30
"""Then, on SIGTERM, vLLM lets the requests in flight finish for up to this long (--shutdown-timeout; vLLM's
default aborts them, and the proxy answered a client 502)."""
VLLM_TERMINATION_GRACE_S: Final = VLLM_DRAIN_DELAY_S + VLLM_SHUTDOWN_TIMEOUT_S + 5
"""The vLLM pods' terminationGracePeriodSeconds: the delay and the drain, and a few seconds to exit."""

APP_NAME: Final = "epd"
MANAGED_BY: Final = "epd-operator"

ANNOTATION_BUNDLE_HASH: Final = f"{GROUP}/bundle-hash"
"""On a role's pod template: the hash of its bundle, so a bundle change rolls exactly that role."""

# Condition types, in the order status reports them.
COND_VALID: Final = "Valid"
COND_STORE_READY: Final = "StoreReady"
COND_ENCODERS_READY: Final = "EncodersReady"
COND_PREFILL_READY: Final = "PrefillReady"
COND_DECODE_READY: Final = "DecodeReady"
COND_PROXY_READY: Final = "ProxyReady"
COND_TRANSFER_READY: Final = "TransferReady"
COND_READY: Final = "Ready"
COND_REDUNDANT: Final = "Redundant"
"""Every serving role runs two or more replicas: no single pod loss stops serving. Not part of Ready."""
COND_AUTOSCALING: Final = "Autoscaling"
"""Every autoscaled role's autoscaler can scale (else its own reason); True when none is autoscaled. Not part of
Ready."""
CONDITION_TYPES: Final = (
    COND_VALID,
    COND_STORE_READY,
    COND_ENCODERS_READY,
    COND_PREFILL_READY,
    COND_DECODE_READY,
    COND_PROXY_READY,
    COND_TRANSFER_READY,
    COND_READY,
    COND_REDUNDANT,
    COND_AUTOSCALING,
)

GPU_RESOURCE: Final = "nvidia.com/gpu"
BUNDLE_FILE: Final = "bundle.json"
BUNDLE_MOUNT_DIR: Final = "/etc/epd"
WORK_DIR: Final = "/var/run/epd"
"""An emptyDir in every pod: the launcher writes derived files here (the root filesystem is read-only)."""
MODEL_MOUNT_DIR: Final = "/models"
