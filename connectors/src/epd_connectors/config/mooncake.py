"""The vLLM-side Mooncake store JSON (the file MOONCAKE_CONFIG_PATH names), typed and checked.

vLLM 0.33 reads this file in ``vllm.distributed.mooncake_store.MooncakeStoreConfig.from_file`` for both the
KV store connector and the encoder-output cache, and passes it to ``MooncakeDistributedStore.setup``. Its
reader is lenient (a missing key gets a default, ``"false"`` is truthy, a tenant id is whitespace-stripped),
so a typo surfaces only as a hang or a silent mismatch at run time. This model refuses such files up front and
renders the exact JSON, always with every key and sizes as integers of bytes.

The address helpers at the bottom are shared with ``master`` and ``store_client``, which must agree with this
file on the same addresses.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any, Self

from pydantic import StrictBool, field_validator, model_validator

from epd_connectors.config import base
from epd_connectors.config.sizes import ByteSize

P2P_HANDSHAKE = "P2PHANDSHAKE"
"""metadata_server value for peer-to-peer handshakes: no metadata service, each engine asks its peer."""
DEFAULT_MASTER_PORT = 50051
DEFAULT_TENANT_ID = "default"
DEFAULT_CLUSTER_ID = "mooncake_cluster"
"""Mooncake's own cluster id: HA masters elect under etcd key mooncake-store/<cluster id>/master_view."""
CLUSTER_ID_ENV = "MC_STORE_CLUSTER_ID"
"""Where an HA client (vLLM's store, mooncake_client) reads the cluster id whose leader it follows; it has no
flag or JSON key for it (Mooncake 0.3.13)."""
RPC_CONNECT_TIMEOUT_ENV = "MC_RPC_CONNECT_TIMEOUT_MS"
HA_RPC_CONNECT_TIMEOUT_MS = 2000
"""An HA client's bound on each attempt to connect to a master (Mooncake's default 30 s, 4 attempts per new
connection): a call begun on a leader whose pod is gone keeps to that address, which answers nothing, so the
default stalls requests for most of a minute after a failover."""


def ha_client_defaults(cluster_id: str | None) -> dict[str, str]:
    """Environment an HA client (vLLM's store, mooncake_client) gets unless the pod sets it; empty without HA."""
    return {RPC_CONNECT_TIMEOUT_ENV: str(HA_RPC_CONNECT_TIMEOUT_MS)} if cluster_id is not None else {}


DEFAULT_SEGMENT_SIZE = 4 * 1024**3
"""vLLM's own default for both sizes (4 GiB), kept so an omitted key means what vLLM would read."""


class Protocol(StrEnum):
    """The transfer engine's transport: RDMA NICs in production, TCP on machines without them."""

    RDMA = "rdma"
    TCP = "tcp"


class StoreMode(StrEnum):
    """Who owns the pool: each vLLM rank (embedded) or a separate mooncake_client (standalone-store)."""

    EMBEDDED = "embedded"
    STANDALONE_STORE = "standalone-store"


class MooncakeStoreConfig(base.ConfigModel):
    """One vLLM process's view of the Mooncake store; every sharer of a store must agree on all addresses,
    the protocol and the tenant id."""

    metadata_server: str
    """Transfer-engine metadata: "P2PHANDSHAKE", or http://HOST:PORT/metadata served by the master's HTTP
    metadata server. No default: it must match how the master was started."""

    master_server_address: str
    """The master's RPC address, HOST:PORT (port 50051 by default), or for an HA master the client form
    etcd://H:P;H:P, redis://H:P or k8s://NAMESPACE/LEASE. No default: vLLM's default "" fails late."""

    protocol: Protocol = Protocol.RDMA
    """Transport; rdma is vLLM's default when the key is absent, so it is ours too. Use tcp without RDMA."""

    device_name: str = ""
    """RDMA devices, comma separated (e.g. "mlx5_0,mlx5_1"); "" lets Mooncake pick. Ignored by tcp."""

    mode: StoreMode = StoreMode.EMBEDDED
    """Pool owner; embedded is vLLM's default. standalone-store needs a mooncake_client owning the pool."""

    global_segment_size: ByteSize = DEFAULT_SEGMENT_SIZE
    """Bytes this process contributes to the shared pool. Default 4 GiB in embedded mode (vLLM's default);
    when omitted in standalone-store mode it is 0, the only value that mode accepts."""

    local_buffer_size: ByteSize = DEFAULT_SEGMENT_SIZE
    """Bytes of registered staging memory for this process's transfers; must be > 0 (vLLM refuses 0).
    Default 4 GiB, vLLM's default; a value must fit the largest single get/put."""

    enable_offload: StrictBool = False
    """Whether the SSD tier may hold this process's data; needs the master and the owner client started with
    offload too. False by default: a RAM store needs nothing else. Strict: vLLM reads "false" as true."""

    tenant_id: str = DEFAULT_TENANT_ID
    """Namespace of keys in the store; producers and consumers that share entries must use the same one.
    "default" is Mooncake's and vLLM's default tenant."""

    cluster_id: str | None = None
    """With HA masters, the cluster whose elected leader this process follows (the masters' --cluster_id);
    set through the environment (`env`), not the JSON vLLM reads. None keeps Mooncake's default."""

    @model_validator(mode="before")
    @classmethod
    def _standalone_segment_default(cls, data: Any) -> Any:
        # The only valid segment size in standalone-store mode is 0, so omitting it should mean 0.
        if (
            isinstance(data, dict)
            and "global_segment_size" not in data
            and str(data.get("mode", "")) == StoreMode.STANDALONE_STORE.value
        ):
            return {**data, "global_segment_size": 0}
        return data

    @field_validator("metadata_server")
    @classmethod
    def _check_metadata_server(cls, value: str) -> str:
        return check_metadata_server("metadata_server", value)

    @field_validator("master_server_address")
    @classmethod
    def _check_master(cls, value: str) -> str:
        return check_master_address("master_server_address", value)

    @field_validator("device_name")
    @classmethod
    def _check_device(cls, value: str) -> str:
        return check_device_names("device_name", value)

    @field_validator("tenant_id")
    @classmethod
    def _check_tenant(cls, value: str) -> str:
        return check_tenant_id("tenant_id", value)

    @model_validator(mode="after")
    def _check_cluster(self) -> Self:
        check_cluster_id(self.cluster_id, self.master_server_address)
        return self

    @field_validator("local_buffer_size")
    @classmethod
    def _check_local_buffer(cls, value: int) -> int:
        if value <= 0:
            raise base.rule_error(
                "local_buffer_size",
                value,
                "vLLM refuses a Mooncake store without a local transfer buffer",
                "set a positive size that fits the largest single value, e.g. '512 MiB'",
            )
        return value

    @model_validator(mode="after")
    def _check_mode_segment(self) -> Self:
        if self.mode is StoreMode.EMBEDDED and self.global_segment_size <= 0:
            raise base.rule_error(
                "global_segment_size",
                self.global_segment_size,
                "embedded mode needs every rank to contribute memory to the pool",
                "set a positive size such as '4 GiB', or use mode 'standalone-store' with a mooncake_client "
                "owning the pool",
            )
        if self.mode is StoreMode.STANDALONE_STORE and self.global_segment_size != 0:
            raise base.rule_error(
                "global_segment_size",
                self.global_segment_size,
                "standalone-store mode makes vLLM a pure requester; the mooncake_client owns the pool",
                "set global_segment_size to 0 and size the pool on the store client, or use mode 'embedded'",
            )
        return self

    def to_json_dict(self) -> dict[str, Any]:
        """Exactly the keys vLLM's reader knows, in its order, every one present, sizes as byte integers."""
        return {
            "metadata_server": self.metadata_server,
            "master_server_address": self.master_server_address,
            "protocol": self.protocol.value,
            "device_name": self.device_name,
            "mode": self.mode.value,
            "global_segment_size": self.global_segment_size,
            "local_buffer_size": self.local_buffer_size,
            "enable_offload": self.enable_offload,
            "tenant_id": self.tenant_id,
        }

    def env(self) -> dict[str, str]:
        """Environment the process needs besides the JSON: the HA cluster id."""
        return {CLUSTER_ID_ENV: self.cluster_id} if self.cluster_id is not None else {}

    def to_json(self) -> str:
        """The file's content; stable (same config, same bytes) so it can feed a rollout hash."""
        return json.dumps(self.to_json_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> MooncakeStoreConfig:
        """Parse a file vLLM would read; raises ValueError (pydantic.ValidationError for an object that breaks
        a rule, json.JSONDecodeError for text that is not JSON)."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(
                f"Mooncake config = {type(data).__name__}: the file must hold a JSON object. "
                'Fix: write an object such as {"metadata_server": "P2PHANDSHAKE", ...}'
            )
        return cls.model_validate(data)

    def setup_kwargs(self, local_hostname: str) -> dict[str, Any]:
        """Keyword arguments for ``MooncakeDistributedStore.setup`` as vLLM passes them (``rdma_devices`` is
        device_name), so a probe or benchmark sets a requester up exactly like vLLM does."""
        return {
            "local_hostname": local_hostname,
            "metadata_server": self.metadata_server,
            "global_segment_size": self.global_segment_size,
            "local_buffer_size": self.local_buffer_size,
            "protocol": self.protocol.value,
            "rdma_devices": self.device_name,
            "master_server_addr": self.master_server_address,
            "tenant_id": self.tenant_id,
        }


# --- address and name rules shared by master.py and store_client.py --------------------------------------

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])"
# Anchored with \Z, not $ (which also matches before a trailing newline), and ASCII-only so \d is 0-9.
HOST_RE = re.compile(rf"^{_HOST}\Z", re.ASCII)
HOST_PORT_RE = re.compile(rf"^({_HOST}):(\d{{1,5}})\Z", re.ASCII)
_METADATA_RE = re.compile(rf"^http://({_HOST}):(\d{{1,5}})/metadata\Z", re.ASCII)
_K8S_LEASE_RE = re.compile(rf"^{_LABEL}/{_LABEL}(?:\.{_LABEL})*\Z", re.ASCII)
# Mooncake refuses ids that are empty, start with "_" or hold control characters; vLLM strips whitespace.
# We also keep to characters that are safe unquoted in argv, YAML and Kubernetes labels.
TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z", re.ASCII)
_DEVICE_RE = re.compile(r"^[A-Za-z0-9_.:-]+(?:,[A-Za-z0-9_.:-]+)*\Z", re.ASCII)


def valid_port(text: str) -> bool:
    """Whether a matched port string is a usable TCP port (the regexes only bound its length)."""
    return text.isdigit() and 1 <= int(text) <= base.MAX_PORT


def check_host(field: str, value: str) -> str:
    """A hostname, IPv4 address or bracketed IPv6 address, without scheme or port."""
    if not HOST_RE.match(value):
        raise base.rule_error(
            field,
            value,
            "not a hostname or IP address",
            "give a bare host such as '10.0.0.5' or 'mooncake-master.ns.svc' (no scheme, no port)",
        )
    return value


def check_host_port(field: str, value: str) -> str:
    """HOST:PORT, the form Mooncake's RPC clients dial."""
    match = HOST_PORT_RE.match(value)
    if not match or not valid_port(match.group(2)):
        raise base.rule_error(
            field,
            value,
            "not HOST:PORT",
            f"give the master's RPC address such as 'mooncake-master:{DEFAULT_MASTER_PORT}'",
        )
    return value


def check_master_address(field: str, value: str) -> str:
    """HOST:PORT, or the HA client forms etcd://H:P[;H:P...], redis://H:P, k8s://NAMESPACE/LEASE."""
    scheme, sep, rest = value.partition("://")
    ok = False
    if not sep:
        ok = (m := HOST_PORT_RE.match(value)) is not None and valid_port(m.group(2))
    elif scheme == "etcd":
        ok = all((m := HOST_PORT_RE.match(e)) is not None and valid_port(m.group(2)) for e in rest.split(";"))
    elif scheme == "redis":
        ok = (m := HOST_PORT_RE.match(rest)) is not None and valid_port(m.group(2))
    elif scheme == "k8s":
        ok = _K8S_LEASE_RE.match(rest) is not None
    if not ok:
        raise base.rule_error(
            field,
            value,
            "not a Mooncake master address",
            f"give HOST:PORT (e.g. 'mooncake-master:{DEFAULT_MASTER_PORT}'), or for an HA master "
            "'etcd://H:P;H:P', 'redis://H:P' or 'k8s://NAMESPACE/LEASE'",
        )
    return value


def check_metadata_server(field: str, value: str) -> str:
    """The P2PHANDSHAKE literal, or the master's HTTP metadata endpoint."""
    if value == P2P_HANDSHAKE:
        return value
    match = _METADATA_RE.match(value)
    if not match or not valid_port(match.group(2)):
        raise base.rule_error(
            field,
            value,
            "not a metadata server Mooncake and vLLM agree on",
            f"use '{P2P_HANDSHAKE}', or 'http://HOST:PORT/metadata' pointing at the master started with "
            "--enable_http_metadata_server=true (port 8080 by default)",
        )
    return value


def check_tenant_id(field: str, value: str) -> str:
    """Mooncake's tenant rules, narrowed to characters that survive argv, YAML and labels unquoted."""
    if not TENANT_RE.match(value):
        raise base.rule_error(
            field,
            value,
            "not a valid tenant id (1-63 of letters, digits, '.', '_', '-', starting with a letter or digit; "
            "Mooncake reserves a leading '_')",
            "use a name such as 'default' or 'team-a'",
        )
    return value


def check_cluster_id(value: str | None, master_server_address: str) -> None:
    """A cluster id names an HA election; it has the tenant id's characters (it becomes part of an etcd key)."""
    if value is None:
        return
    check_tenant_id("cluster_id", value)
    if "://" not in master_server_address:
        raise base.rule_error(
            "cluster_id",
            value,
            f"only HA masters are elected under a cluster id, and master_server_address "
            f"{master_server_address!r} names one master",
            "remove cluster_id, or give the HA form such as 'etcd://etcd-0:2379'",
        )


def check_device_names(field: str, value: str) -> str:
    """Comma separated RDMA device names, or empty for automatic selection."""
    if value and not _DEVICE_RE.match(value):
        raise base.rule_error(
            field,
            value,
            "not a comma separated list of RDMA device names",
            "give names such as 'mlx5_0' or 'mlx5_0,mlx5_1', or '' to let Mooncake choose",
        )
    return value


def gflag(value: bool) -> str:
    """A boolean as Mooncake's gflags binaries take it (--flag=true / --flag=false)."""
    return "true" if value else "false"
