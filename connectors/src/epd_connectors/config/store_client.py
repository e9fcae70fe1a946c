"""A standalone store owner: the ``mooncake_client`` process that holds the pool in standalone-store mode.

In standalone-store mode vLLM ranks contribute no memory; this process mounts the segment (and the optional
SSD tier) and keeps it alive across vLLM restarts. Its flags must agree with the vLLM JSON on the master, the
metadata server, the protocol and the tenant, so the model can derive that JSON (``requester_config``) rather
than have both written by hand. Flag names were checked against ``mooncake_client --help`` of
mooncake-transfer-engine 0.3.13 (note ``--device_names``, plural, unlike the JSON's ``device_name``).
"""

from __future__ import annotations

from typing import Self

from pydantic import StrictBool, field_validator, model_validator

from epd_connectors.config import base
from epd_connectors.config import mooncake as mc
from epd_connectors.config.sizes import ByteSize

CLIENT_BINARY = "mooncake_client"
DEFAULT_CLIENT_PORT = 50052
DEFAULT_HTTP_PORT = 9300
OFFLOAD_PATH_ENV = "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"
"""Where the client keeps SSD-tier files; Mooncake reads it from the environment, there is no flag."""
_ALL_INTERFACES = "0.0.0.0"  # the RPC listener in a pod binds every interface


class StoreClientConfig(base.ConfigModel):
    """One mooncake_client owning part of the pool for every requester of its tenant."""

    host: str
    """The address this client advertises to peers (and binds its RPC port to): the pod's own IP from the
    downward API. No default: 0.0.0.0 would be advertised and be unreachable for peers."""

    port: base.Port = DEFAULT_CLIENT_PORT
    """The client's RPC service port; 50052 is Mooncake's default."""

    global_segment_size: ByteSize
    """Bytes of RAM this client contributes to the pool; must be > 0 (an owner without memory owns
    nothing). No default: Mooncake's 4 GB default is rarely what a pod's memory limit allows."""

    local_buffer_size: ByteSize = 0
    """Bytes of registered staging buffer for the client's own transfers; 0 (Mooncake's default) is enough
    for a pure owner, which only serves reads and writes of its segment by others."""

    master_server_address: str
    """The master's RPC address HOST:PORT, or an HA client form (etcd://..., redis://..., k8s://...)."""

    metadata_server: str = mc.P2P_HANDSHAKE
    """Transfer-engine metadata; must equal the requesters' value. P2PHANDSHAKE needs no metadata service."""

    protocol: mc.Protocol = mc.Protocol.TCP
    """Transport; must equal the requesters'. tcp is mooncake_client's own default."""

    device_name: str = ""
    """RDMA devices, comma separated (``--device_names``); "" lets Mooncake choose. Ignored by tcp."""

    tenant_id: str = mc.DEFAULT_TENANT_ID
    """The tenant whose data this client stores; must equal the requesters' tenant_id."""

    cluster_id: str | None = None
    """With HA masters, the cluster whose leader this client follows (MC_STORE_CLUSTER_ID); see
    MooncakeStoreConfig.cluster_id."""

    enable_offload: StrictBool = False
    """Keep an SSD tier under offload_path; the master and the vLLM JSON must enable offload too."""

    offload_path: str = ""
    """Directory of the SSD tier (MOONCAKE_OFFLOAD_FILE_STORAGE_PATH); required with offload, "" otherwise."""

    enable_http_server: StrictBool = False
    """Serve this client's health and metrics over HTTP; off by default as in Mooncake."""

    http_port: base.Port = DEFAULT_HTTP_PORT
    """Port of that HTTP server (when enabled); 9300 is Mooncake's default."""

    threads: int = 1
    """RPC service threads; Mooncake's default 1 suffices because data moves through the transfer engine."""

    @field_validator("host")
    @classmethod
    def _check_host(cls, value: str) -> str:
        mc.check_host("host", value)
        if value == _ALL_INTERFACES:
            raise base.rule_error(
                "host",
                value,
                "the client advertises this address to peers, and 0.0.0.0 is not reachable",
                "give the pod's own IP (downward API status.podIP) or a resolvable hostname",
            )
        return value

    @field_validator("global_segment_size")
    @classmethod
    def _check_segment(cls, value: int) -> int:
        if value <= 0:
            raise base.rule_error(
                "global_segment_size",
                value,
                "a store owner must contribute memory to the pool",
                "set a positive size such as '4 GiB' within the pod's memory limit",
            )
        return value

    @field_validator("master_server_address")
    @classmethod
    def _check_master(cls, value: str) -> str:
        return mc.check_master_address("master_server_address", value)

    @field_validator("metadata_server")
    @classmethod
    def _check_metadata(cls, value: str) -> str:
        return mc.check_metadata_server("metadata_server", value)

    @field_validator("device_name")
    @classmethod
    def _check_device(cls, value: str) -> str:
        return mc.check_device_names("device_name", value)

    @field_validator("tenant_id")
    @classmethod
    def _check_tenant(cls, value: str) -> str:
        return mc.check_tenant_id("tenant_id", value)

    @field_validator("threads")
    @classmethod
    def _check_threads(cls, value: int) -> int:
        if value <= 0:
            raise base.rule_error("threads", value, "the RPC service needs a thread", "give 1 or more")
        return value

    @model_validator(mode="after")
    def _check_cluster(self) -> Self:
        mc.check_cluster_id(self.cluster_id, self.master_server_address)
        return self

    @model_validator(mode="after")
    def _check_offload(self) -> Self:
        if self.enable_offload and not self.offload_path.startswith("/"):
            raise base.rule_error(
                "offload_path",
                self.offload_path,
                "offload needs an absolute directory for the SSD tier",
                f"set offload_path (exported as {OFFLOAD_PATH_ENV}) to a mounted volume, e.g. '/mnt/ssd'",
            )
        if not self.enable_offload and self.offload_path:
            raise base.rule_error(
                "offload_path",
                self.offload_path,
                "an offload directory is ignored unless offload is enabled",
                "set enable_offload true, or remove offload_path",
            )
        if self.enable_http_server and self.http_port == self.port:
            raise base.rule_error(
                "http_port",
                self.http_port,
                "the HTTP server would collide with the RPC port",
                "pick another port",
            )
        return self

    def argv(self, binary: str = CLIENT_BINARY) -> list[str]:
        """The command line; sizes as integers of bytes (Mooncake reads "4 GiB" as 0), bools as true/false."""
        args = [
            binary,
            f"--host={self.host}",
            f"--port={self.port}",
            f"--global_segment_size={self.global_segment_size}",
            f"--local_buffer_size={self.local_buffer_size}",
            f"--master_server_address={self.master_server_address}",
            f"--metadata_server={self.metadata_server}",
            f"--protocol={self.protocol.value}",
            f"--device_names={self.device_name}",
            f"--tenant_id={self.tenant_id}",
            f"--enable_offload={mc.gflag(self.enable_offload)}",
            f"--threads={self.threads}",
            f"--enable_http_server={mc.gflag(self.enable_http_server)}",
        ]
        if self.enable_http_server:
            args.append(f"--http_port={self.http_port}")
        return args

    def env(self) -> dict[str, str]:
        """Environment the process needs besides argv (the HA cluster id, the SSD tier's directory)."""
        env = {mc.CLUSTER_ID_ENV: self.cluster_id} if self.cluster_id is not None else {}
        return env | ({OFFLOAD_PATH_ENV: self.offload_path} if self.enable_offload else {})

    @classmethod
    def from_argv(cls, argv: list[str], env: dict[str, str] | None = None) -> StoreClientConfig:
        """Inverse of ``argv``/``env`` (for tests and for reading a running pod's command)."""
        names = {
            "host": "host",
            "port": "port",
            "global_segment_size": "global_segment_size",
            "local_buffer_size": "local_buffer_size",
            "master_server_address": "master_server_address",
            "metadata_server": "metadata_server",
            "protocol": "protocol",
            "device_names": "device_name",
            "tenant_id": "tenant_id",
            "enable_offload": "enable_offload",
            "threads": "threads",
            "enable_http_server": "enable_http_server",
            "http_port": "http_port",
        }
        data: dict[str, object] = {}
        for arg in argv[1:]:
            flag, sep, value = arg.removeprefix("--").partition("=")
            if not arg.startswith("--") or not sep or flag not in names:
                raise ValueError(f"argv = {arg!r}: not a mooncake_client flag we render. Fix: use --flag=value")
            is_bool = flag in ("enable_offload", "enable_http_server")
            data[names[flag]] = {"true": True, "false": False}.get(value, value) if is_bool else value
        for key, name in ((OFFLOAD_PATH_ENV, "offload_path"), (mc.CLUSTER_ID_ENV, "cluster_id")):
            if key in (env or {}):
                data[name] = (env or {})[key]
        return cls.model_validate(data)

    def requester_config(self, local_buffer_size: int | str = mc.DEFAULT_SEGMENT_SIZE) -> mc.MooncakeStoreConfig:
        """The vLLM JSON of a pure requester of this owner (standalone-store, segment 0), agreeing with it
        on master, metadata server, protocol, devices, tenant and offload."""
        return mc.MooncakeStoreConfig.model_validate(
            {
                "metadata_server": self.metadata_server,
                "master_server_address": self.master_server_address,
                "protocol": self.protocol,
                "device_name": self.device_name,
                "mode": mc.StoreMode.STANDALONE_STORE,
                "global_segment_size": 0,
                "local_buffer_size": local_buffer_size,
                "enable_offload": self.enable_offload,
                "tenant_id": self.tenant_id,
                "cluster_id": self.cluster_id,
            }
        )
