"""A complete, valid set of bundles for one E+PD deployment with a standalone Mooncake store and cross-encoder
reuse; tests derive broken variants from it so each test changes exactly one thing."""

from __future__ import annotations

from typing import Any

import pytest

from epd_connectors.config.bundle import RoleBundle

MASTER = "epd-master:50051"
HEALTH = "http://epd-master:9003/health"
METRICS = "http://epd-master:9003/metrics"


def _store_json(**overrides: Any) -> dict[str, Any]:
    return {
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": MASTER,
        "protocol": "tcp",
        "mode": "standalone-store",
        "global_segment_size": 0,
        "local_buffer_size": "512 MiB",
        "tenant_id": "demo-tenant",
        **overrides,
    }


def sample_bundle_data() -> dict[str, dict[str, Any]]:
    """Plain data (as a user or the operator would write it) for every role of the sample deployment."""
    head = {"apiVersion": "epd.serving.io/v1alpha1", "kind": "RoleBundle", "deployment": "demo"}
    peers = {"master_health_url": HEALTH, "master_metrics_url": METRICS}
    return {
        "master": {
            **head,
            "role": "master",
            "master": {
                "enable_multi_tenants": True,
                "tenant_quota_policy": {"version": 1, "tenants": [{"name": "demo-tenant", "quota": 1 << 30}]},
                "tenant_quota_policy_path": "/var/run/epd/tenant_quota.yaml",
            },
        },
        "store-client": {
            **head,
            "role": "store-client",
            "store_client": {
                "host": "127.0.0.1",
                "global_segment_size": "1 GiB",
                "master_server_address": MASTER,
                "protocol": "tcp",
                "tenant_id": "demo-tenant",
            },
            "peers": peers,
        },
        "encoder": {
            **head,
            "role": "encoder",
            "vllm": {
                "role": "encoder",
                "model": "/models/tiny",
                "port": 8001,
                "use_v2_model_runner": True,
                "python_hash_seed": 7,
            },
            "ec_transfer": {
                "ec_connector": "ECMooncakeConnector",
                "ec_role": "ec_producer",
                "ec_connector_extra_config": {
                    "mooncake_protocol": "tcp",
                    "cross_encoder_cache": True,
                    "embedding_cache_prefix": "emb-1",
                },
            },
            "mooncake": _store_json(),
            "peers": peers,
        },
        "pd": {
            **head,
            "role": "pd",
            "vllm": {"role": "pd", "model": "/models/tiny", "port": 8002, "python_hash_seed": 7},
            "ec_transfer": {
                "ec_connector": "ECMooncakeConnector",
                "ec_role": "ec_consumer",
                "ec_ip": "epd-pd-0",
                "ec_port": 14579,
                "ec_connector_extra_config": {"mooncake_protocol": "tcp"},
            },
            "kv_transfer": {
                "kv_connector": "MooncakeStoreConnector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {"cache_prefix": "kv-1"},
            },
            "mooncake": _store_json(),
            "peers": peers,
        },
        "proxy": {
            **head,
            "role": "proxy",
            "proxy": {"port": 8000},
            "peers": {
                "encoders": [{"host": "epd-encoder", "port": 8001}],
                "pd": [{"host": "epd-pd", "port": 8002}],
                "ec_consumers": ["tcp://epd-pd-0:14579"],
            },
        },
    }


@pytest.fixture
def bundle_data() -> dict[str, dict[str, Any]]:
    return sample_bundle_data()


@pytest.fixture
def bundles(bundle_data: dict[str, dict[str, Any]]) -> dict[str, RoleBundle]:
    return {name: RoleBundle.model_validate(data) for name, data in bundle_data.items()}
