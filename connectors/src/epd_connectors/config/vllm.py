"""One vLLM OpenAI server per role (encoder, prefill, decode or combined PD), rendered to its argv and env.

Every flag the operator derives (model, ports, parallel sizes, the transfer configs, the encoder's
mandatory flags) is a typed field here and appears in the argv exactly once; free-form ``extra_args`` may add
anything else but may not override one of ours, since a second ``--port`` or ``--kv-transfer-config`` would
silently win in argparse and break what the operator matched across roles. The rules that span the server and
its EC/KV configs live in ``transfer_rules``; the bundle runs them when it is validated, ``argv`` only renders.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Literal

from pydantic import BeforeValidator, ValidationInfo, field_validator, model_validator

from epd_connectors.config import _transfer_common
from epd_connectors.config.base import ConfigModel, Port, as_tuple, rule_error
from epd_connectors.config.ec_transfer import ECConfig
from epd_connectors.config.kv_transfer import AnyKVConfig
from epd_connectors.config.media import DOMAINS_FLAG, LOCAL_PATH_FLAG, MediaAccess
from epd_connectors.config.roles import Role, VllmRole

"""What the instance does: encoder (vision/audio encoder only), prefill, decode, or combined pd."""

ModelDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
"""vLLM 0.33's ``--dtype`` choices."""

PrefixCachingHashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
"""vLLM 0.33's ``--prefix-caching-hash-algo`` choices."""

VllmVersion = Literal["0.32", "0.33", "0.34"]
"""The vLLM minor versions bundles are rendered for: their flags, environment and connector keys differ
(docs/vllm-0.34.md)."""

DEFAULT_VLLM_VERSION: VllmVersion = "0.33"
"""The vLLM of the default GPU image (images/vllm)."""

V2_ONLY_VERSIONS: frozenset[str] = frozenset({"0.34"})
"""vLLMs with Model Runner V2 alone: VLLM_USE_V2_MODEL_RUNNER is gone, and any value but 1 is refused."""

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""What ``argv()`` follows: ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` fails in the
CPU build)."""

ENCODER_MAX_NUM_BATCHED_TOKENS = 114688
"""The encoder's scheduler budget: effectively unlimited, as in vLLM's disaggregated-encoder examples; the
encoder cache manager sets the real budget."""

# Every flag argv() renders, with the spellings argparse would also accept for it. vLLM turns '_' into '-'
# and accepts unambiguous prefixes (argparse allow_abbrev), so both are refused in extra_args too.
OWNED_FLAGS: dict[str, str] = {
    "--model": "model",
    "--served-model-name": "served_model_name",
    "--host": "host",
    "--port": "port",
    "--dtype": "dtype",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--data-parallel-size": "data_parallel_size",
    "-dp": "data_parallel_size",
    "--block-size": "block_size",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--mm-processor-cache-gb": "mm_processor_cache_gb",
    "--mm-encoder-only": "mm_encoder_only",
    "--no-mm-encoder-only": "mm_encoder_only",
    "--enable-lora": "enable_lora",
    "--no-enable-lora": "enable_lora",
    "--enforce-eager": "enforce_eager",
    "--no-enforce-eager": "enforce_eager",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--enable-mm-embeds": "enable_mm_embeds",
    "--no-enable-mm-embeds": "enable_mm_embeds",
    "--no-enable-prefix-caching": "enable_prefix_caching",
    "--prefix-caching-hash-algo": "prefix_caching_hash_algo",
    "--shutdown-timeout": "shutdown_timeout_s",
    DOMAINS_FLAG: "media.domains",
    LOCAL_PATH_FLAG: "media.local_path",
    "--ec-transfer-config": "ec_transfer_config",
    "--kv-transfer-config": "kv_transfer_config",
    # A YAML file of arguments could set any of the above behind our back.
    "--config": "extra_args",
}


_INVERSE_PREFIXES = (("--no-disable-", "--enable-"), ("--no-enable-", "--disable-"), ("--no-", "--"))
"""What a negated spelling also names: vLLM 0.33's EnableDisableAction pairs every --enable-X with --disable-X (and
keeps --no-enable-X, --no-disable-X), argparse's BooleanOptionalAction adds --no-X to every --X."""
_PAIRED = (("--disable-", "--enable-"), ("--enable-", "--disable-"))


def owned_flag(arg: str, owned: Collection[str] = OWNED_FLAGS) -> str | None:
    """The flag of `owned` an extra argument would set, read as vLLM's argparse reads it: '_' as '-', the
    '--flag=value' and '--json-flag.key' forms, unambiguous prefixes (allow_abbrev, short forms too: -t is -tp), and
    every negated or paired spelling of a boolean (--no-X, --disable-X for --enable-X and back)."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    if not arg.startswith("--"):
        short = arg.split("=", 1)[0]
        # argparse takes a single-dash prefix of one short option for it: "-t" sets -tp.
        return _match(short, [flag for flag in owned if not flag.startswith("--")])
    name = "--" + arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
    longs = [flag for flag in owned if flag.startswith("--")]
    for spelling in _spellings(name):
        flag = _match(spelling, longs)
        if flag is not None:
            return flag
    return None


def _spellings(name: str) -> list[str]:
    """`name` and what it names besides: --no-X also sets --X; --disable-X sets --enable-X (and back)."""
    found = [name]
    for prefix, other in (*_INVERSE_PREFIXES, *_PAIRED):
        if name.startswith(prefix) and len(name) > len(prefix):
            found.append(other + name.removeprefix(prefix))
    for spelling in list(found[1:]):
        found += [other + spelling.removeprefix(prefix) for prefix, other in _PAIRED if spelling.startswith(prefix)]
    return list(dict.fromkeys(found))


def _match(name: str, owned: list[str]) -> str | None:
    """The owned flag `name` is, or abbreviates (argparse allow_abbrev); a prefix of several is refused too."""
    if name in owned:
        return name
    matches = sorted(flag for flag in owned if flag.startswith(name))
    return matches[0] if len(name.lstrip("-")) > 0 and matches else None


class VllmServerConfig(ConfigModel):
    """The settings of one vLLM OpenAI API server; ``argv()`` and ``env()`` render them."""

    # Strict like the transfer configs: "8000" or true must not pass for a port.
    model_config = _transfer_common.TRANSFER_MODEL_CONFIG

    role: VllmRole
    """What the instance does; decides the flags the role requires."""

    model: str
    """Model path (or id) as vLLM loads it; encoders that share outputs must use the same path."""

    served_model_name: str | None = None
    """Name clients use in requests; None lets vLLM use the model path."""

    host: str = "0.0.0.0"
    """Address the HTTP server binds; all interfaces, since the pod IP is only known at run time."""

    port: Port = 8000
    """HTTP port (vLLM's default)."""

    dtype: ModelDType = "auto"
    """Model dtype; "auto" uses the checkpoint's. Part of cross-encoder store keys."""

    tensor_parallel_size: int = 1
    """Tensor parallel size (GPUs per replica); encoders with ECMooncakeConnector need 1."""

    pipeline_parallel_size: int = 1
    """Pipeline parallel size; encoders with ECMooncakeConnector need 1."""

    data_parallel_size: int = 1
    """Data parallel replicas inside this server; encoders with ECMooncakeConnector need 1."""

    block_size: int | None = None
    """KV block size in tokens; None keeps vLLM's (the CPU build's 128 transfers nothing for short prompts,
    use 32 there)."""

    max_num_batched_tokens: int | None = None
    """Scheduler token budget per step; None is vLLM's default, except on encoders (114688, effectively
    unlimited)."""

    mm_processor_cache_gb: float = 4.0
    """GiB of the multimodal processor cache (vLLM default 4); cross-encoder reuse needs it above 0."""

    mm_encoder_only: bool | None = None
    """Skip the language model at load; None means true on encoders (saves device memory), false elsewhere."""

    enable_lora: bool = False
    """Serve LoRA adapters; cross-encoder reuse does not support it."""

    vllm_version: VllmVersion = DEFAULT_VLLM_VERSION
    """The vLLM this server runs (its image's): what its flags, environment and connector keys may be."""

    use_v2_model_runner: bool | None = None
    """VLLM_USE_V2_MODEL_RUNNER; None lets vLLM choose (V1 where V2 is unavailable, e.g. on the CPU). vLLM 0.34
    runs V2 only: leave it unset there."""

    enforce_eager: bool | None = None
    """Disable CUDA graphs; None means true on encoders (required there), vLLM's default elsewhere."""

    enable_prefix_caching: bool | None = None
    """Local prefix caching; None means off on encoders (required there), vLLM's default elsewhere."""

    enable_mm_embeds: bool | None = None
    """Accept ``*_embeds`` content items (the proxy rewrites media items to them once an encoder has produced
    their embeddings); None means on wherever an EC consumer config is given, vLLM's default (off) elsewhere."""

    prefix_caching_hash_algo: PrefixCachingHashAlgo | None = None
    """Block hash algorithm; xxhash variants need one python_hash_seed across store sharers."""

    python_hash_seed: int | None = None
    """PYTHONHASHSEED; one value per deployment on every pod sharing a store. None leaves it unset."""

    mooncake_bootstrap_port: Port | None = None
    """VLLM_MOONCAKE_BOOTSTRAP_PORT for MooncakeConnector (vLLM default 8998); distinct per instance on a
    host."""

    shutdown_timeout_s: int = 0
    """--shutdown-timeout: how long vLLM lets the requests in flight finish after SIGTERM before it stops; 0, vLLM's
    default (no flag), aborts them at once."""

    media: MediaAccess = MediaAccess()
    """The media URLs the instance may fetch besides inline data URLs (vLLM's allow-lists)."""

    extra_args: Annotated[tuple[str, ...], BeforeValidator(as_tuple)] = ()
    """Further vLLM arguments, appended last; may not set a flag this model owns."""

    @field_validator("model", "served_model_name", "host")
    @classmethod
    def _word(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Each is the value of a flag: empty, or starting with '-', argparse would read it wrongly.
        name = info.field_name or "value"
        if value is not None and not value.strip():
            raise rule_error(name, value, "is empty", f"give the {name.replace('_', ' ')}")
        if value is not None and value.startswith("-"):
            raise rule_error(name, value, "starts with '-' (argparse would take it for a flag)", "rename it")
        return value

    @field_validator(
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "block_size",
        "max_num_batched_tokens",
    )
    @classmethod
    def _positive_ints(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value < 1:
            raise rule_error(info.field_name or "size", value, "must be at least 1", "use 1 or more")
        return value

    @field_validator("mm_processor_cache_gb")
    @classmethod
    def _cache_gb(cls, value: float) -> float:
        if not 0 <= value < float("inf"):
            raise rule_error("mm_processor_cache_gb", value, "must be a finite number >= 0", "use 4 (vLLM default)")
        return value

    @field_validator("shutdown_timeout_s")
    @classmethod
    def _shutdown_timeout(cls, value: int) -> int:
        if value < 0:
            raise rule_error("shutdown_timeout_s", value, "is negative", "use 0 (abort at once) or more seconds")
        return value

    @field_validator("python_hash_seed")
    @classmethod
    def _seed(cls, value: int | None) -> int | None:
        # Python refuses to start with a PYTHONHASHSEED outside 0..4294967295.
        if value is not None and not 0 <= value <= 4294967295:
            raise rule_error("python_hash_seed", value, "is outside 0..4294967295", "use a 32-bit unsigned value")
        return value

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arg in value:
            flag = owned_flag(arg)
            if flag is not None:
                raise rule_error(
                    "extra_args",
                    arg,
                    f"would override {flag}, which the operator sets (field {OWNED_FLAGS[flag]})",
                    f"set {OWNED_FLAGS[flag]} instead of passing {flag}",
                )
        return value

    @model_validator(mode="after")
    def _runner_exists(self) -> VllmServerConfig:
        if self.vllm_version in V2_ONLY_VERSIONS and self.use_v2_model_runner is not None:
            raise rule_error(
                "use_v2_model_runner",
                self.use_v2_model_runner,
                f"vLLM {self.vllm_version} has only Model Runner V2 (VLLM_USE_V2_MODEL_RUNNER is gone; 0 is refused)",
                "leave it unset",
            )
        return self

    @model_validator(mode="after")
    def _role_flags(self) -> VllmServerConfig:
        if self.role == Role.ENCODER:
            # vLLM's disaggregated-encoder docs: encoders must run eager and without prefix caching.
            if self.enforce_eager is False:
                raise rule_error("enforce_eager", False, "encoders must run eager", "leave it unset or true")
            if self.enable_prefix_caching is True:
                raise rule_error(
                    "enable_prefix_caching",
                    True,
                    "encoders hold no KV cache to cache",
                    "leave it unset or false",
                )
        elif self.mm_encoder_only:
            raise rule_error(
                "mm_encoder_only",
                True,
                f"a {self.role} instance needs the language model",
                "set it on encoders only",
            )
        if self.mooncake_bootstrap_port is not None and self.mooncake_bootstrap_port == self.port:
            raise rule_error("mooncake_bootstrap_port", self.port, "equals the HTTP port", "use another port")
        return self

    # Effective values: what the role implies where the field is left unset.
    def effective_enforce_eager(self) -> bool | None:
        """True on encoders unless set; None elsewhere means vLLM's default (no flag)."""
        return True if self.role == Role.ENCODER and self.enforce_eager is None else self.enforce_eager

    def effective_prefix_caching(self) -> bool | None:
        """False on encoders unless set; None elsewhere means vLLM's default (no flag)."""
        return False if self.role == Role.ENCODER else self.enable_prefix_caching

    def effective_max_num_batched_tokens(self) -> int | None:
        """The encoder's large budget unless set; None elsewhere means vLLM's default."""
        if self.max_num_batched_tokens is None and self.role == Role.ENCODER:
            return ENCODER_MAX_NUM_BATCHED_TOKENS
        return self.max_num_batched_tokens

    def argv(self, ec: ECConfig | None = None, kv: AnyKVConfig | None = None) -> list[str]:
        """The arguments after ``python -m vllm.entrypoints.openai.api_server``. It does not check that the EC/KV
        configs fit this server: ``transfer_rules.check_transfers`` does, before (a RoleBundle runs it)."""
        args = ["--model", self.model]
        if self.served_model_name is not None:
            args += ["--served-model-name", self.served_model_name]
        args += ["--host", self.host, "--port", str(self.port), "--dtype", self.dtype]
        args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        args += ["--pipeline-parallel-size", str(self.pipeline_parallel_size)]
        args += ["--data-parallel-size", str(self.data_parallel_size)]
        if self.block_size is not None:
            args += ["--block-size", str(self.block_size)]
        budget = self.effective_max_num_batched_tokens()
        if budget is not None:
            args += ["--max-num-batched-tokens", str(budget)]
        args += ["--mm-processor-cache-gb", _number(self.mm_processor_cache_gb)]
        encoder_only = self.mm_encoder_only if self.mm_encoder_only is not None else self.role == Role.ENCODER
        if encoder_only:
            args.append("--mm-encoder-only")
        if self.enable_lora:
            args.append("--enable-lora")
        args += _bool_flag("--enforce-eager", self.effective_enforce_eager())
        args += _bool_flag("--enable-prefix-caching", self.effective_prefix_caching())
        consumes = ec is not None and self.role in (Role.PREFILL, Role.PD)
        args += _bool_flag(
            "--enable-mm-embeds", True if self.enable_mm_embeds is None and consumes else self.enable_mm_embeds
        )
        if self.prefix_caching_hash_algo is not None:
            args += ["--prefix-caching-hash-algo", self.prefix_caching_hash_algo]
        if self.shutdown_timeout_s:
            args += ["--shutdown-timeout", str(self.shutdown_timeout_s)]
        args += self.media.vllm_args()
        if ec is not None:
            args += ["--ec-transfer-config", ec.to_cli_json()]
        if kv is not None:
            args += ["--kv-transfer-config", kv.to_cli_json()]
        return [*args, *self.extra_args]

    def env(self) -> dict[str, str]:
        """Environment variables for the server process. VLLM_HOST_IP is not here: it must be the pod's own IP
        (downward API), which only the pod knows; MOONCAKE_CONFIG_PATH belongs to the store config."""
        env: dict[str, str] = {}
        if self.use_v2_model_runner is not None:
            env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if self.use_v2_model_runner else "0"
        if self.mooncake_bootstrap_port is not None:
            env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(self.mooncake_bootstrap_port)
        if self.python_hash_seed is not None:
            env["PYTHONHASHSEED"] = str(self.python_hash_seed)
        return env | self.media.vllm_env()


def _bool_flag(flag: str, value: bool | None) -> list[str]:
    """``--flag`` / ``--no-flag`` (argparse BooleanOptionalAction), nothing for None (vLLM's default)."""
    if value is None:
        return []
    return [flag] if value else ["--no-" + flag.removeprefix("--")]


def _number(value: float) -> str:
    """4.0 as "4", 0.5 as "0.5": what a human would type, parsed identically by vLLM."""
    return str(int(value)) if float(value).is_integer() else repr(value)
