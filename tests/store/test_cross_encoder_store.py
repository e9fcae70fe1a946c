"""Cross-encoder reuse, store side, for real (vLLM itself cannot run it on the CPU: it needs Model Runner V2).

examples/e-pd-mooncake-cross-encoder.yaml is rendered on the loopback site (the local runner's plan, CPU
profile), its master and store client run through epd-launch from the rendered bundles, and each encoder pod's
store requester is set up from the mooncake_config.json epd-launch generates for it, read as vLLM 0.33.0
reads it (``distributed/mooncake_store.py``). Objects are written and read as vLLM's ECMooncakeConnector does
(``mooncake_store_embedding/store_client.py``): key ``<namespace>@id:<mm hash>``, value = 24-byte header +
tensor bytes, put from registered buffers as a TENSOR object, looked up with ``batch_is_exist`` and read with
``batch_get_into``.

Proven: an embedding encoder A publishes is found and read back byte for byte by encoder B (the reuse path);
another deployment of the same model (same key) does not see it, whether the store refuses its tenant or admits
it; the same model at another revision does not hit it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import json
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_connectors import store_probe
from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.ec_transfer import (
    embedding_key,
    embedding_namespace,
    embedding_value_header,
    parse_embedding_value_header,
)
from epd_connectors.config.master import TenantQuotaPolicy
from epd_connectors.config.roles import Role
from epd_connectors.launch.plan import LaunchPlan, plan_launch
from epd_local import processes, profile
from epd_local.plan import POD_IP, LocalPlan

pytestmark = pytest.mark.store

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "e-pd-mooncake-cross-encoder.yaml"
STORE_ROLES = {"master", "store-client"}
TOKENS, HIDDEN = 16, 64
"""One image's output: 16 tokens of hidden size 64, bf16 (2 KiB after the header)."""
ENCODER_HASH = "mmcfg-0"
"""Stands for vLLM's MultiModalConfig hash, the same on every encoder (it depends only on their shared argv)."""
TORCH_DTYPES = {"bfloat16": "torch.bfloat16", "float16": "torch.float16", "float32": "torch.float32"}


# --- the example, rendered -------------------------------------------------------------------------------


def manifest(tmp_path: Path, name: str, **model: Any) -> Path:
    """The example as another deployment: its own name, optionally other model fields."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["model"].update(model)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def plan(path: Path, workdir: Path) -> LocalPlan:
    return processes.plan_on_free_ports(path, workdir, workdir / "no-model", profile.CPU)


def bundle(of: LocalPlan, role: Role) -> RoleBundle:
    [instance] = [i for i in of.instances if i.role is role]
    return instance.bundle


def encoder_pod(of: LocalPlan, workdir: Path) -> LaunchPlan:
    """One encoder pod's launch, its files written where epd-launch writes them. Every pod of the encoder
    Deployment mounts the same bundle; the local plan has one instance, so two pods are two launches of it."""
    launch = plan_launch(
        bundle(of, Role.ENCODER),
        workdir=str(workdir),
        bundle_path=str(workdir / "bundle.json"),
        environ={"POD_IP": POD_IP},
    )
    workdir.mkdir(parents=True, exist_ok=True)
    for path, content in launch.files.items():
        Path(path).write_text(content)
    return launch


def key_of(launch: LaunchPlan, mm_hash: str) -> str:
    """The key vLLM 0.33's ECMooncakeConnector writes for this image (build_embedding_namespace)."""
    argv = launch.argv
    ec = json.loads(argv[argv.index("--ec-transfer-config") + 1])
    extra = ec["ec_connector_extra_config"]
    assert extra["cross_encoder_cache"] is True and ec["ec_role"] == "ec_producer"
    assert "--revision" not in argv  # vLLM writes "revision:default"
    namespace = embedding_namespace(
        prefix=extra["embedding_cache_prefix"],
        model=extra.get("embedding_model_identity", argv[argv.index("--model") + 1]),
        encoder_hash=ENCODER_HASH,
        dtype=TORCH_DTYPES[argv[argv.index("--dtype") + 1]],
    )
    return embedding_key(namespace, mm_hash)


# --- a requester, as vLLM sets it up and uses it -------------------------------------------------------


class Requesters:
    """MooncakeDistributedStore requesters set up from encoder pods' generated JSON; closed together."""

    def __init__(self) -> None:
        self.stores: list[Any] = []

    def open(self, launch: LaunchPlan, **override: str) -> Any:
        """vLLM's MooncakeStoreConfig.from_file + setup_mooncake_store, from the file MOONCAKE_CONFIG_PATH names
        (``override`` changes fields of the read JSON: another deployment pointed at this store)."""
        from mooncake.store import MooncakeDistributedStore  # noqa: PLC0415 - native wheel

        with open(launch.env["MOONCAKE_CONFIG_PATH"], encoding="utf-8") as file:
            config = {**json.load(file), **override}
        assert config["mode"] == "standalone-store" and config["global_segment_size"] == 0
        assert config["enable_offload"] is False
        tenant = (config.get("tenant_id") or "").strip() or "default"
        store = MooncakeDistributedStore()
        code = store.setup(
            launch.env.get("MOONCAKE_REQUESTER_LOCAL_HOSTNAME") or launch.env["VLLM_HOST_IP"],
            config["metadata_server"],
            config["global_segment_size"],
            config["local_buffer_size"],
            config["protocol"],
            config["device_name"],
            config["master_server_address"],
            **({"tenant_id": tenant} if tenant != "default" else {}),
        )
        assert code == 0, f"setup: {store_probe.describe(code)}"
        self.stores.append(store)
        return store

    def close(self) -> None:
        with ThreadPoolExecutor() as pool:  # ~1 s each
            list(pool.map(lambda store: store.close(), self.stores))
        self.stores.clear()


@contextlib.contextmanager
def requesters() -> Iterator[Requesters]:
    opened = Requesters()
    try:
        yield opened
    finally:
        opened.close()


def publish(store: Any, key: str, value: bytes) -> int:
    """vLLM's _save / put_tensor: skip a key that exists, else put header and tensor from registered buffers."""
    from mooncake.store import ObjectDataType, ReplicateConfig  # noqa: PLC0415

    if store.batch_is_exist([key]) == [1]:
        return 0
    header = ctypes.create_string_buffer(value[:24], 24)
    tensor = ctypes.create_string_buffer(value[24:], len(value) - 24)
    parts = [(ctypes.addressof(header), 24), (ctypes.addressof(tensor), len(value) - 24)]
    for address, size in parts:
        assert store.register_buffer(address, size) == 0
    try:
        config = ReplicateConfig()
        config.data_type = ObjectDataType.TENSOR
        [result] = store.batch_put_from_multi_buffers([key], [[a for a, _ in parts]], [[s for _, s in parts]], config)
    finally:
        for address, _ in parts:
            store.unregister_buffer(address)
    return int(result)


def lookup(store: Any, key: str, size: int) -> tuple[int, int, bytes]:
    """vLLM's resolve_inputs / _load_chunk: (batch_is_exist state, batch_get_into result, bytes read)."""
    [state] = store.batch_is_exist([key])
    buffer = ctypes.create_string_buffer(size)
    assert store.register_buffer(ctypes.addressof(buffer), size) == 0
    try:
        [result] = store.batch_get_into([key], [ctypes.addressof(buffer)], [size])
    finally:
        store.unregister_buffer(ctypes.addressof(buffer))
    return int(state), int(result), buffer.raw


def embedding(seed: bytes) -> tuple[str, bytes]:
    """An image's mm hash and its encoder output as a stored value."""
    tensor = hashlib.shake_256(seed).digest(TOKENS * HIDDEN * 2)
    return hashlib.sha256(seed).hexdigest(), embedding_value_header("bfloat16", TOKENS, HIDDEN) + tensor


def start_store(of: LocalPlan, workdir: Path) -> contextlib.AbstractContextManager[processes.LocalDeployment]:
    return processes.deployment(of, workdir, Path(sys.executable), say=lambda line: None, only=STORE_ROLES)


def wait_for_pool(of: LocalPlan) -> None:
    master = bundle(of, Role.MASTER).master
    assert master is not None
    store_probe.wait_for_capacity(master.metrics_url(POD_IP), at_least=1, timeout_s=20)


# --- the tests ------------------------------------------------------------------------------------------


def test_one_encoders_embedding_is_reused_by_another_and_by_no_other_deployment_or_revision(
    tmp_path: Path, mooncake_binaries: None
) -> None:
    a = plan(EXAMPLE, tmp_path / "a")
    # Another deployment of the same model, and the same deployment at a new revision (rendered, not started).
    other = plan(manifest(tmp_path, "qwen-vl-canary"), tmp_path / "other")
    newer = plan(manifest(tmp_path, "qwen-vl", revision="0123456789abcdef0123456789abcdef01234567"), tmp_path / "new")
    encoder_a, encoder_b = encoder_pod(a, tmp_path / "a" / "encoder-0"), encoder_pod(a, tmp_path / "a" / "encoder-1")
    encoder_other, encoder_newer = (
        encoder_pod(other, tmp_path / "other" / "encoder-0"),
        encoder_pod(newer, tmp_path / "new" / "encoder-0"),
    )
    [file_a], [file_b] = encoder_a.files.values(), encoder_b.files.values()
    assert file_a == file_b  # every encoder pod gets the same store settings
    mm_hash, value = embedding(b"an image both encoders are asked to encode")
    key = key_of(encoder_a, mm_hash)
    assert key == key_of(encoder_b, mm_hash)
    # The other deployment's encoders use the same key (same model), under their own tenant.
    assert key_of(encoder_other, mm_hash) == key
    json_a, json_other = json.loads(file_a), json.loads(next(iter(encoder_other.files.values())))
    assert {k for k in json_a if json_a[k] != json_other[k]} == {"tenant_id", "master_server_address"}
    # The new revision's encoders use another key, which differs only in the derived prefix.
    newer_key = key_of(encoder_newer, mm_hash)
    assert newer_key != key and newer_key.split("@", 1)[1] == key.split("@", 1)[1]

    with start_store(a, tmp_path / "a"), requesters() as opened:
        wait_for_pool(a)
        store_a, store_b = opened.open(encoder_a), opened.open(encoder_b)
        # The other deployment's encoder, pointed at this store.
        stranger = opened.open(encoder_other, master_server_address=json_a["master_server_address"])

        assert lookup(store_b, key, len(value))[:2] == (0, store_probe.OBJECT_NOT_FOUND)  # a miss: B would encode
        assert publish(store_a, key, value) == 0
        # Reachable: encoder B finds A's output and reads it back byte for byte, header as vLLM validates it.
        state, result, got = lookup(store_b, key, len(value))
        assert (state, result) == (1, len(value))
        assert got == value
        assert tuple(parse_embedding_value_header(got)) == ("bfloat16", TOKENS, HIDDEN)
        assert publish(store_b, key, b"x" * len(value)) == 0  # exists: B publishes nothing over it
        assert lookup(store_a, key, len(value))[2] == value

        # Isolated: the store admits only this deployment's tenant; the other one sees nothing, writes nothing.
        assert lookup(stranger, key, len(value))[:2] == (0, store_probe.OBJECT_NOT_FOUND)
        assert publish(stranger, key, value) == store_probe.TENANT_NOT_REGISTERED

        # Another revision: the same store and tenant, no hit.
        assert lookup(store_a, newer_key, len(value))[:2] == (0, store_probe.OBJECT_NOT_FOUND)


def test_two_deployments_admitted_to_one_store_do_not_see_each_others_embeddings(
    tmp_path: Path, mooncake_binaries: None
) -> None:
    """One store whose master admits both deployments (the union of their rendered quota policies): the same
    model gives the same key, and each tenant still reads only its own object under it."""
    a = plan(EXAMPLE, tmp_path / "a")
    other = plan(manifest(tmp_path, "qwen-vl-canary"), tmp_path / "other")
    master_a, master_other = bundle(a, Role.MASTER).master, bundle(other, Role.MASTER).master
    assert master_a is not None and master_other is not None
    assert master_a.tenant_quota_policy is not None and master_other.tenant_quota_policy is not None
    both = TenantQuotaPolicy.model_validate(
        {"tenants": [*master_a.tenant_quota_policy.tenants, *master_other.tenant_quota_policy.tenants]}
    )
    shared = dataclasses.replace(a, instances=[_with_policy(i, both) for i in a.instances])

    encoder_a, encoder_other = encoder_pod(a, tmp_path / "a" / "encoder-0"), encoder_pod(other, tmp_path / "o")
    mm_hash, value = embedding(b"the same image sent to both deployments")
    _, other_value = embedding(b"what the other deployment's encoder computed")
    key = key_of(encoder_a, mm_hash)
    assert key_of(encoder_other, mm_hash) == key

    with start_store(shared, tmp_path / "a"), requesters() as opened:
        wait_for_pool(shared)
        store_a = opened.open(encoder_a)
        master_address = json.loads(next(iter(encoder_a.files.values())))["master_server_address"]
        store_other = opened.open(encoder_other, master_server_address=master_address)
        assert publish(store_a, key, value) == 0
        assert lookup(store_other, key, len(value))[:2] == (0, store_probe.OBJECT_NOT_FOUND)
        assert publish(store_other, key, other_value) == 0  # admitted: its own object under the same key
        assert lookup(store_other, key, len(value))[1:] == (len(value), other_value)
        assert lookup(store_a, key, len(value))[1:] == (len(value), value)


def _with_policy(instance: Any, policy: TenantQuotaPolicy) -> Any:
    if instance.role is not Role.MASTER:
        return instance
    assert instance.bundle.master is not None
    master = instance.bundle.master.model_copy(update={"tenant_quota_policy": policy})
    changed = instance.bundle.model_copy(update={"master": master})
    return dataclasses.replace(instance, bundle=changed, bundle_json=changed.to_json())
