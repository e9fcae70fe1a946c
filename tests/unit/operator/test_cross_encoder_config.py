"""Cross-encoder reuse as the operator configures it (it cannot run on the CPU: it needs Model Runner V2).

Rendering examples/e-pd-mooncake-cross-encoder.yaml and launching each encoder pod from its bundle (what
epd-launch does) must give a process that vLLM 0.33.0 accepts with ``cross_encoder_cache`` on, and every encoder
the same store namespace, tenant, master and protocol. The judge is ``VllmReader`` below: what vLLM 0.33.0's own
readers accept and derive, written from the wheel (``vllm/config/ec_transfer.py``,
``distributed/ec_transfer/ec_connector/mooncake/config.py``, ``mooncake_store_embedding/{data,store_client}.py``,
``distributed/mooncake_store.py``, ``envs.py``, ``engine/arg_utils.py``), not from our own models.
``test_the_reader_refuses_what_vllm_refuses`` shows it can fail.
"""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_connectors.config.bundle import RoleBundle, parse_bundle
from epd_connectors.config.ec_transfer import embedding_namespace
from epd_connectors.config.roles import Role
from epd_connectors.launch.plan import LaunchPlan, plan_launch
from epd_operator.api import constants as c
from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import Desired, render_desired

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "e-pd-mooncake-cross-encoder.yaml"
OWNER = Owner(name="qwen-vl", namespace="serving", uid="00000000-0000-4000-8000-00000000ce01")
POD_IPS = ("10.4.0.11", "10.4.0.12")
"""Two encoder pods of the same Deployment: one ConfigMap bundle, each pod its own IP."""

# --- vLLM 0.33.0's readers --------------------------------------------------------------------------------

VLLM_EC_FIELDS = {
    "ec_connector",
    "engine_id",
    "ec_buffer_device",
    "ec_buffer_size",
    "ec_role",
    "ec_ip",
    "ec_port",
    "ec_connector_extra_config",
    "ec_connector_module_path",
}
"""ECTransferConfig's init fields; any other key fails the dataclass."""
VLLM_EC_ROLES = ("ec_producer", "ec_consumer", "ec_both")
VLLM_MOONCAKE_EXTRA_KEYS = {
    "mooncake_protocol",
    "control_timeout_s",
    "push_wait_timeout_s",
    "cross_encoder_cache",
    "embedding_cache_prefix",
    "embedding_model_identity",
    "store_max_pending_items",
    "store_max_pending_bytes",
    "store_read_buffer_bytes",
}
"""Every key ECMooncakeConnector reads with get_from_extra_config (others are silently ignored)."""
VLLM_TORCH_DTYPES = {
    "bfloat16": "torch.bfloat16",
    "float16": "torch.float16",
    "half": "torch.float16",
    "float32": "torch.float32",
    "float": "torch.float32",
}
"""``--dtype`` -> ``str(model_config.dtype)``, the ``@dtype:`` part of a key ("auto" is resolved from the
checkpoint, which a render cannot know)."""
MM_CONFIG_HASH_FLAGS = (
    "--mm-encoder-attn-backend",
    "--mm-encoder-tp-mode",
    "--mm-encoder-attn-dtype",
    "--mm-encoder-fp8-scale-path",
    "--mm-device-do-normalize",
)
"""The flags of MultiModalConfig.compute_hash's factors: the ``@encoder:`` part of a key. Processor kwargs
(max_pixels) are not among them, so only the prefix keeps encoders with different ones apart."""
VLLM_SIZE_RE = re.compile(r"^\s*([\d.]+)\s*(gb|mb|kb|b)?\s*$")
VLLM_SIZE_UNITS = {"gb": 1024**3, "mb": 1024**2, "kb": 1024, "b": 1}


class VllmRefusedError(AssertionError):
    """vLLM 0.33.0 would refuse this launch (at engine start, or when the store client is created)."""


def _last(argv: list[str], *flags: str) -> str | None:
    """The value argparse keeps: the last occurrence of any spelling."""
    value = None
    for i, arg in enumerate(argv[:-1]):
        if arg in flags:
            value = argv[i + 1]
    return value


def _bool_flag(argv: list[str], flag: str) -> bool | None:
    """A BooleanOptionalAction: the last of --flag / --no-flag."""
    value = None
    for arg in argv:
        if arg == flag:
            value = True
        elif arg == "--no-" + flag.removeprefix("--"):
            value = False
    return value


def _positive_int(name: str, value: Any) -> int:
    # mooncake/config.py _positive_int: no bools; ints, integral floats or int strings; above 0.
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise VllmRefusedError(f"ECMooncakeConnector requires {name} to be a positive integer.")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise VllmRefusedError(f"ECMooncakeConnector requires {name} to be a positive integer.")
        value = int(value)
    try:
        number = int(value)
    except ValueError as exc:
        raise VllmRefusedError(f"ECMooncakeConnector requires {name} to be a positive integer.") from exc
    if number <= 0:
        raise VllmRefusedError(f"ECMooncakeConnector requires {name} > 0.")
    return number


def _positive_float(name: str, value: Any) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError) as exc:
        raise VllmRefusedError(f"ECMooncakeConnector requires {name} > 0.") from exc
    if not math.isfinite(number) or number <= 0:
        raise VllmRefusedError(f"ECMooncakeConnector requires {name} > 0.")
    return number


def _vllm_size(value: Any) -> int:
    # mooncake_store.py _parse_size: ints as they are, strings with GB/MB/KB/B only (no "GiB").
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return int(value)
    match = VLLM_SIZE_RE.match(value.strip().lower())
    if not match:
        raise VllmRefusedError(f"Invalid format: '{value}'")
    return int(float(match.group(1)) * VLLM_SIZE_UNITS[match.group(2) or "b"])


@dataclass(frozen=True)
class StoreView:
    """What MooncakeStoreConfig.from_file reads and setup_mooncake_store passes to setup()."""

    metadata_server: str
    master_server_address: str
    protocol: str
    device_name: str
    mode: str
    global_segment_size: int
    local_buffer_size: int
    enable_offload: bool
    tenant_id: str


def read_store(text: str) -> StoreView:
    data = json.loads(text)
    mode = data.get("mode", "embedded")
    if mode not in ("embedded", "standalone-store"):
        raise VllmRefusedError(f"unknown Mooncake mode: {mode!r}")
    segment = _vllm_size(data.get("global_segment_size", 4 * 1024**3))
    buffer = _vllm_size(data.get("local_buffer_size", 4 * 1024**3))
    if buffer <= 0:
        raise VllmRefusedError("local_buffer_size must be > 0")
    if mode == "embedded" and segment == 0:
        raise VllmRefusedError("embedded mode requires global_segment_size > 0")
    if mode == "standalone-store" and segment != 0:
        raise VllmRefusedError("standalone-store mode requires global_segment_size == 0")
    tenant = data.get("tenant_id", "default")
    if tenant is not None and not isinstance(tenant, str):
        raise VllmRefusedError(f"tenant_id must be a string or null, got {tenant!r}")
    return StoreView(
        metadata_server=data.get("metadata_server", ""),
        master_server_address=data.get("master_server_address", ""),
        protocol=data.get("protocol", "rdma"),
        device_name=data.get("device_name", ""),
        mode=mode,
        global_segment_size=segment,
        local_buffer_size=buffer,
        enable_offload=bool(data.get("enable_offload", False)),
        tenant_id=(tenant or "").strip() or "default",
    )


@dataclass(frozen=True)
class VllmReader:
    """One vLLM 0.33.0 server as it would read its launch; construction raises VllmRefusedError where vLLM would."""

    launch: LaunchPlan

    @property
    def argv(self) -> list[str]:
        return self.launch.argv

    @property
    def ec(self) -> dict[str, Any]:
        text = _last(self.argv, "--ec-transfer-config")
        if text is None:
            raise VllmRefusedError("no --ec-transfer-config")
        data: dict[str, Any] = json.loads(text)
        if set(data) - VLLM_EC_FIELDS:
            raise VllmRefusedError(f"ECTransferConfig has no fields {sorted(set(data) - VLLM_EC_FIELDS)}")
        if data.get("ec_role") not in VLLM_EC_ROLES:
            raise VllmRefusedError(f"Unsupported ec_role: {data.get('ec_role')}")
        return data

    @property
    def extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = self.ec.get("ec_connector_extra_config", {})
        return extra

    def _parallel(self, long: str, short: str) -> int:
        return int(_last(self.argv, long, short) or 1)

    def check_connector(self) -> None:
        """MooncakeECConfig.from_vllm_config: what every ECMooncakeConnector instance must pass."""
        ec, extra = self.ec, self.extra
        if ec["ec_connector"] != "ECMooncakeConnector":
            raise VllmRefusedError(f"ec_connector = {ec['ec_connector']!r}")
        producer = ec["ec_role"] in ("ec_producer", "ec_both")
        if producer:
            for long, short in (("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp")):
                if self._parallel(long, short) > 1:
                    raise VllmRefusedError(f"ECMooncakeConnector producers need {long} 1")
            if self._parallel("--data-parallel-size", "-dp") > 1:
                raise VllmRefusedError("ECMooncakeConnector producers require data_parallel_size=1.")
        _positive_int("ec_buffer_size", ec.get("ec_buffer_size", 1e9))
        reuse = extra.get("cross_encoder_cache", False)
        if not isinstance(reuse, bool):
            raise VllmRefusedError("cross_encoder_cache must be a boolean")
        if reuse:
            self._check_reuse()
        port = int(ec.get("ec_port", 14579))
        if not 1 <= port <= port + self._parallel("--tensor-parallel-size", "-tp") - 1 <= 65535:
            raise VllmRefusedError("ECMooncakeConnector ec_port must be in 1..65535.")
        for name, default in (("control_timeout_s", 30), ("push_wait_timeout_s", 60)):
            _positive_float(name, extra.get(name, default))
        for name, default in (
            ("store_max_pending_items", 32),
            ("store_max_pending_bytes", 2 * 1024**3),
            ("store_read_buffer_bytes", 128 * 1024**2),
        ):
            _positive_int(name, extra.get(name, default))

    def _check_reuse(self) -> None:
        if self.ec["ec_role"] != "ec_producer":  # is_encode_only: a producer and not a consumer
            raise VllmRefusedError("cross_encoder_cache requires an Encoder-only producer")
        runner = self.launch.env.get("VLLM_USE_V2_MODEL_RUNNER")
        try:
            # envs.maybe_convert_bool: bool(int(value)); unset, vLLM picks (V1 without Triton, as on the CPU).
            v2 = runner is not None and bool(int(runner))
        except ValueError as exc:
            raise VllmRefusedError(f"VLLM_USE_V2_MODEL_RUNNER = {runner!r}: int() fails") from exc
        if not v2:
            raise VllmRefusedError("cross_encoder_cache requires Model Runner V2")
        if _bool_flag(self.argv, "--enable-lora"):
            raise VllmRefusedError("cross_encoder_cache does not support LoRA")
        if float(_last(self.argv, "--mm-processor-cache-gb") or 4) == 0:
            raise VllmRefusedError("cross_encoder_cache requires mm_processor_cache_gb > 0")
        # create_mooncake_embedding_store_client: MOONCAKE_CONFIG_PATH, a RAM store.
        if self.store().enable_offload:
            raise VllmRefusedError("cross_encoder_cache supports a RAM Store; disable enable_offload")

    def store(self) -> StoreView:
        path = self.launch.env.get("MOONCAKE_CONFIG_PATH")
        if not path:
            raise VllmRefusedError("The environment variable 'MOONCAKE_CONFIG_PATH' is not set.")
        if path not in self.launch.files:
            raise VllmRefusedError(f"MOONCAKE_CONFIG_PATH = {path}: epd-launch writes no such file")
        return read_store(self.launch.files[path])

    def namespace(self) -> str:
        """build_embedding_namespace: the part of every store key before ``@id:<mm hash>``."""
        extra = self.extra
        dtype = _last(self.argv, "--dtype") or "auto"
        if dtype not in VLLM_TORCH_DTYPES:
            raise AssertionError(f"--dtype {dtype}: the key's dtype is only known at run time")
        mm_factors = [_last(self.argv, flag) for flag in MM_CONFIG_HASH_FLAGS]
        prefix = str(extra.get("embedding_cache_prefix", ""))
        return (
            (f"{prefix}@" if prefix else "")
            + "embedding"
            + f"@model:{extra.get('embedding_model_identity', _last(self.argv, '--model'))}"
            + f"@revision:{_last(self.argv, '--revision') or 'default'}"
            + f"@encoder:mm-config{mm_factors}"  # stands for the hash of these factors
            + f"@dtype:{VLLM_TORCH_DTYPES[dtype]}"
            + "@protocol:v3"
        )

    def host_ip(self) -> str:
        """get_ip(): VLLM_HOST_IP, the address the store requester registers under."""
        return self.launch.env["VLLM_HOST_IP"]


# --- rendering and launching ----------------------------------------------------------------------------


def example_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    return spec


def render(spec: dict[str, Any] | None = None, owner: Owner = OWNER) -> Desired:
    return render_desired(owner, parse_spec(spec or example_spec()), OperatorDefaults())


def bundles_by_role(desired: Desired) -> dict[str, RoleBundle]:
    """role -> its bundle, read back from each workload's mounted ConfigMap."""
    maps = {o["metadata"]["name"]: o for o in desired.objects if o["kind"] == "ConfigMap"}
    found: dict[str, RoleBundle] = {}
    for workload in (o for o in desired.objects if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")):
        pod = workload["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if "configMap" in v)
        bundle = parse_bundle(maps[volume["configMap"]["name"]]["data"][c.BUNDLE_FILE])
        assert bundle.role.value not in found, f"two workloads of role {bundle.role.value}"
        found[bundle.role.value] = bundle
    return found


def pod_launches(desired: Desired, role: str) -> list[VllmReader]:
    """Every pod of the role's workload, launched as epd-launch would launch it in that pod."""
    workload = next(
        o for o in desired.objects if o["kind"] == "Deployment" and o["metadata"]["labels"][c.LABEL_ROLE] == role
    )
    container = workload["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    command = container["command"]
    assert command[:2] == ["epd-launch", role]
    bundle = bundles_by_role(desired)[role]
    ips = POD_IPS[: workload["spec"]["replicas"]]
    return [
        VllmReader(
            plan_launch(
                bundle,
                workdir=env["EPD_WORKDIR"],
                bundle_path=command[command.index("--bundle") + 1],
                environ={"POD_IP": ip},
            )
        )
        for ip in ips
    ]


def encoder_namespace(desired: Desired) -> str:
    namespaces = {reader.namespace() for reader in pod_launches(desired, Role.ENCODER)}
    assert len(namespaces) == 1
    return namespaces.pop()


# --- the tests ------------------------------------------------------------------------------------------


def test_every_encoder_pod_is_a_cross_encoder_producer_vllm_accepts() -> None:
    desired = render()
    encoders = pod_launches(desired, Role.ENCODER)
    assert len(encoders) == 2  # spec.encoder.replicas
    for reader in encoders:
        reader.check_connector()
        assert reader.extra["cross_encoder_cache"] is True
        assert set(reader.extra) <= VLLM_MOONCAKE_EXTRA_KEYS
        assert reader.ec["ec_role"] == "ec_producer"
        assert reader.launch.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
        assert "--mm-encoder-only" in reader.argv
    # Everything vLLM derives from the launch is the same on every pod but the address it advertises.
    a, b = encoders
    assert (a.ec, a.store(), a.namespace()) == (b.ec, b.store(), b.namespace())
    assert {a.host_ip(), b.host_ip()} == set(POD_IPS)


def test_every_encoder_publishes_to_the_deployments_store_tenant_and_namespace() -> None:
    desired = render()
    roles = bundles_by_role(desired)
    client, master = roles[Role.STORE_CLIENT].store_client, roles[Role.MASTER].master
    assert client is not None and master is not None
    for reader in pod_launches(desired, Role.ENCODER):
        store = reader.store()
        # The pool's owner and the master's policy: the same store, the same tenant, the same transport.
        assert store.master_server_address == client.master_server_address == "qwen-vl-master.serving.svc:50051"
        assert store.master_server_address.endswith(f":{master.rpc_port}")
        assert (store.metadata_server, store.device_name) == (client.metadata_server, client.device_name)
        assert store.protocol == client.protocol.value == reader.extra["mooncake_protocol"] == "rdma"
        assert store.tenant_id == client.tenant_id == desired.derived.tenant_id == "serving.qwen-vl"
        assert master.enable_multi_tenants and master.tenant_quota_policy is not None
        assert [t.name for t in master.tenant_quota_policy.tenants] == [store.tenant_id]
        # A pure requester of a RAM-only store owned by the store clients.
        assert (store.mode, store.global_segment_size, store.enable_offload) == ("standalone-store", 0, False)
        # Keys: the derived prefix, the model's name (not its mount path), the pinned dtype.
        namespace = reader.namespace()
        prefix = desired.derived.embedding_cache_prefix
        assert namespace.startswith(f"{prefix}@embedding@model:Qwen/Qwen2-VL-7B-Instruct@revision:default@")
        assert namespace.endswith("@dtype:torch.bfloat16@protocol:v3")
        assert prefix.startswith("emb-") and reader.extra["embedding_cache_prefix"] == prefix
        # The library's key helper, which the store tests and the status use, writes what vLLM writes.
        mm_hash = namespace.split("@encoder:", 1)[1].split("@dtype:", 1)[0]
        assert namespace == embedding_namespace(
            prefix=prefix,
            model="Qwen/Qwen2-VL-7B-Instruct",
            revision=None,
            encoder_hash=mm_hash,
            dtype="torch.bfloat16",
        )


def test_the_consumer_receives_pushes_without_publishing() -> None:
    desired = render()
    [encoder, *_] = pod_launches(desired, Role.ENCODER)
    for reader in pod_launches(desired, Role.PD):
        reader.check_connector()
        assert reader.ec["ec_role"] == "ec_consumer"
        assert reader.ec["ec_ip"] == reader.host_ip()  # its control server is reachable at the pod IP
        assert not {"cross_encoder_cache", "embedding_cache_prefix"} & set(reader.extra)
        assert reader.extra["mooncake_protocol"] == encoder.extra["mooncake_protocol"]
        assert "--enable-mm-embeds" in reader.argv  # the proxy sends it *_embeds items
        # Its own store use (KV offload) is the same store and tenant as the encoders'.
        assert (reader.store().master_server_address, reader.store().tenant_id) == (
            encoder.store().master_server_address,
            encoder.store().tenant_id,
        )


def test_a_consumer_without_kv_offload_needs_no_store() -> None:
    spec = example_spec()
    spec["decode"]["kv"]["storeOffload"] = False
    desired = render(spec)
    [pd] = pod_launches(desired, Role.PD)
    pd.check_connector()
    assert "MOONCAKE_CONFIG_PATH" not in pd.launch.env and pd.launch.files == {}
    for encoder in pod_launches(desired, Role.ENCODER):
        encoder.check_connector()  # the encoders still have their store
        assert encoder.store().tenant_id == desired.derived.tenant_id


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (("model", "revision"), "0123456789abcdef0123456789abcdef01234567"),
        (("model", "dtype"), "float16"),
        (("model", "mmProcessorKwargs", "max_pixels"), 401408),
        (("model", "source"), {"image": {"reference": "weights/qwen2-vl@sha256:" + "a" * 64}}),
    ],
    ids=["revision", "dtype", "max_pixels", "weights-image"],
)
def test_what_changes_encoder_output_changes_every_key(field: tuple[str, ...], value: Any) -> None:
    """Encoders of the old and the new model never read each other's embeddings. vLLM's own key cannot tell
    them apart (no --revision is passed, a weights image or max_pixels are not in it): the prefix does."""
    before = example_spec()
    after = copy.deepcopy(before)
    section = after
    for key in field[:-1]:
        section = section[key]
    section[field[-1]] = value
    old, new = encoder_namespace(render(before)), encoder_namespace(render(after))
    assert old != new
    old_prefix, old_rest = old.split("@", 1)
    new_prefix, new_rest = new.split("@", 1)
    assert old_prefix != new_prefix
    if field[-1] != "dtype":
        assert old_rest == new_rest  # only the prefix separates them


def test_what_does_not_change_encoder_output_keeps_the_keys() -> None:
    """Scaling, the PD's parallelism, the store's size and transport, the proxy: embeddings stay valid."""
    spec = example_spec()
    before = encoder_namespace(render(spec))
    spec["encoder"]["replicas"] = 5
    spec["decode"]["tensorParallelSize"] = 4
    spec["store"]["clients"]["segmentSize"] = "16GiB"
    spec["store"]["protocol"] = "tcp"
    spec["proxy"]["replicas"] = 1
    assert encoder_namespace(render(spec)) == before


@pytest.mark.parametrize(
    "other",
    [
        Owner(name="qwen-vl-canary", namespace="serving", uid="00000000-0000-4000-8000-00000000ce02"),
        Owner(name="qwen-vl", namespace="staging", uid="00000000-0000-4000-8000-00000000ce03"),
    ],
    ids=["other-name", "other-namespace"],
)
def test_two_deployments_of_one_model_share_keys_but_never_a_tenant(other: Owner) -> None:
    """The same model gives the same namespace (the embeddings would be valid for both), so what keeps two
    deployments apart in a store is the tenant: a different one in every file of each, and a master that
    admits only its own."""
    a, b = render(), render(owner=other)
    assert encoder_namespace(a) == encoder_namespace(b)
    assert a.derived.tenant_id != b.derived.tenant_id
    masters = []
    for desired in (a, b):
        roles = bundles_by_role(desired)
        users = [r.store() for role in (Role.ENCODER, Role.PD) for r in pod_launches(desired, role)]
        client, master = roles[Role.STORE_CLIENT].store_client, roles[Role.MASTER].master
        assert client is not None and master is not None and master.tenant_quota_policy is not None
        tenants = {u.tenant_id for u in users} | {
            client.tenant_id,
            *(t.name for t in master.tenant_quota_policy.tenants),
        }
        assert tenants == {desired.derived.tenant_id}
        # No field names another deployment's master: each renders and uses its own (a store is never shared).
        [address] = {u.master_server_address for u in users} | {client.master_server_address}
        masters.append(address)
    assert masters[0] != masters[1]


@pytest.mark.parametrize(
    ("sabotage", "message"),
    [
        (lambda ec, env, store: env.update(VLLM_USE_V2_MODEL_RUNNER="true"), "int() fails"),
        (lambda ec, env, store: env.pop("VLLM_USE_V2_MODEL_RUNNER"), "requires Model Runner V2"),
        (lambda ec, env, store: ec.update(ec_role="ec_both"), "Encoder-only producer"),
        (lambda ec, env, store: ec["ec_connector_extra_config"].update(cross_encoder_cache="true"), "a boolean"),
        (lambda ec, env, store: ec["ec_connector_extra_config"].update(store_max_pending_items=0), "> 0"),
        (lambda ec, env, store: ec.update(ec_rank=0), "has no fields"),
        (lambda ec, env, store: store.update(mode="standalone"), "unknown Mooncake mode"),
        (lambda ec, env, store: store.update(global_segment_size="4 GiB"), "Invalid format"),
        (lambda ec, env, store: store.update(enable_offload=True), "RAM Store"),
        (lambda ec, env, store: env.pop("MOONCAKE_CONFIG_PATH"), "MOONCAKE_CONFIG_PATH"),
    ],
    ids=[
        "v2-not-an-int",
        "v2-unset",
        "ec-both",
        "reuse-as-string",
        "zero-budget",
        "unknown-field",
        "mode-standalone",
        "gib-size",
        "offload",
        "no-config-path",
    ],
)
def test_the_reader_refuses_what_vllm_refuses(sabotage: Any, message: str) -> None:
    """The judge of the tests above can fail: each launch vLLM 0.33.0 would refuse, it refuses."""
    [encoder, *_] = pod_launches(render(), Role.ENCODER)
    launch = encoder.launch
    ec, env = json.loads(encoder.argv[encoder.argv.index("--ec-transfer-config") + 1]), dict(launch.env)
    [(path, text)] = launch.files.items()
    store = json.loads(text)
    sabotage(ec, env, store)
    argv = list(launch.argv)
    argv[argv.index("--ec-transfer-config") + 1] = json.dumps(ec)
    broken = VllmReader(LaunchPlan(argv=argv, env=env, files={path: json.dumps(store)}))
    with pytest.raises(VllmRefusedError, match=re.escape(message)):
        broken.check_connector()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--enable-lora"], "does not support LoRA"),
        (["--mm-processor-cache-gb", "0"], "mm_processor_cache_gb > 0"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size 1"),
    ],
)
def test_the_reader_reads_the_last_flag_as_argparse_does(argv: list[str], message: str) -> None:
    [encoder, *_] = pod_launches(render(), Role.ENCODER)
    launch = encoder.launch
    broken = VllmReader(LaunchPlan(argv=[*launch.argv, *argv], env=launch.env, files=launch.files))
    with pytest.raises(VllmRefusedError, match=re.escape(message)):
        broken.check_connector()
