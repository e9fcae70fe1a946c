"""The model every role serves and where its weights come from; its identity decides the cache prefixes."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, WithJsonSchema

from epd_operator.api import kube as k
from epd_operator.api._base import ApiModel, NodePath
from epd_operator.api._rules import Rule, RuledModel

_ANY_SCALAR = WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True})
"""A JSON scalar of any type (the CRD's structural schema has no union of types)."""


class PvcSource(ApiModel):
    """A PersistentVolumeClaim holding the weights (mounted read-only)."""

    claim_name: str = Field(min_length=1, max_length=253, pattern=k.DNS_1123_SUBDOMAIN)
    """Name of the claim in the EPDDeployment's namespace."""


class HostPathSource(ApiModel):
    """A directory on every node (for pre-staged weights)."""

    path: NodePath
    """Absolute path on the node."""


class ImageSource(ApiModel):
    """An OCI image holding the weights, mounted as an image volume (Kubernetes 1.33+)."""

    reference: str = Field(min_length=1, max_length=k.STRING_MAX, pattern=k.IMAGE)
    """Image reference, pinned by digest for reproducible prefixes."""
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """When the kubelet pulls the image."""


class ModelSource(RuledModel):
    """Where the weights come from: exactly one of pvc, hostPath, image."""

    RULES: ClassVar[tuple[Rule[ModelSource], ...]] = (
        Rule(
            "spec.model.source",
            lambda s: len(s.sources_given) == 1,
            lambda s: s.sources_given,
            "needs exactly one source",
            "give one of pvc, hostPath or image",
            cel="[has(self.pvc), has(self.hostPath), has(self.image)].filter(x, x).size() == 1",
            cel_message="spec.model.source: give exactly one of pvc, hostPath or image",
        ),
    )

    pvc: PvcSource | None = None
    """Weights on a PersistentVolumeClaim."""
    host_path: HostPathSource | None = None
    """Weights in a node directory."""
    image: ImageSource | None = None
    """Weights in an OCI image."""

    @property
    def sources_given(self) -> list[str]:
        return [n for n, v in (("pvc", self.pvc), ("hostPath", self.host_path), ("image", self.image)) if v]


Modality = Literal["image", "audio", "video"]


class ModelSpec(RuledModel):
    """The model every role serves; its identity decides the cache prefixes."""

    RULES: ClassVar[tuple[Rule[ModelSpec], ...]] = (
        Rule(
            "spec.model.modalities",
            lambda m: bool({"image", "audio"} & set(m.modalities)),
            lambda m: list(m.modalities),
            "names no image or audio input, and the proxy proves each encoder's transfer path with one of them",
            "list every input the model takes: add 'image' for a vision model (video models take images too), "
            "'audio' for an audio model",
            cel="self.modalities.exists(m, m == 'image' || m == 'audio')",
        ),
    )

    name: str = Field(min_length=1, max_length=k.STRING_MAX)
    """Model identity, e.g. Qwen/Qwen2-VL-7B-Instruct. Part of every derived cache prefix."""
    revision: str = Field(default="main", min_length=1, max_length=k.STRING_MAX)
    """Weights revision (commit, tag or digest). A new revision gives new cache prefixes, so stale embeddings
    and KV blocks are never reused."""
    served_model_name: str | None = Field(default=None, min_length=1, max_length=k.STRING_MAX)
    """The name clients send in requests; defaults to name."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Weights and activation dtype; part of the cache identity."""
    source: ModelSource
    """Where the weights are."""
    path: str = Field(default="", max_length=k.STRING_MAX)
    """Directory of the weights inside the source (relative); vLLM loads /models/<path>."""
    mm_processor_cache_gb: float = Field(default=4.0, ge=0, le=k.SIZE_MAX // 1024**3, alias="mmProcessorCacheGB")
    """GiB of vLLM's multimodal processor cache per instance; cross-encoder reuse needs it above 0."""
    mm_processor_kwargs: dict[str, Annotated[str | int | float | bool, _ANY_SCALAR]] = Field(
        default={}, max_length=k.MAP_MAX
    )
    """vLLM --mm-processor-kwargs (e.g. max_pixels). They change encoder output, so they are part of the
    embedding cache identity."""
    modalities: list[Modality] = Field(default=["image"], min_length=1, max_length=3)
    """The media the model takes, which its encoders encode. The proxy's transfer canaries send an image, or an
    audio clip when the model takes audio and no images (Qwen2-Audio refuses an image)."""
    block_size: int | None = Field(default=None, ge=1, le=k.INT32_MAX)
    """KV cache block size in tokens (vLLM --block-size) of every prefill, decode and PD instance; one value for
    all, since KV moves between them in blocks. vLLM's default when unset (the CPU build needs 32)."""
