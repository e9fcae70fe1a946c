"""store_probe without a store: error naming, and that importing it needs no Mooncake wheel."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from epd_connectors import store_probe
from epd_connectors.config import master, mooncake, store_client

pytestmark = pytest.mark.unit


def test_store_error_names_the_code() -> None:
    error = store_probe.StoreError("put 'k'", store_probe.TENANT_NOT_REGISTERED)
    assert error.code == -1701
    assert str(error) == "put 'k' failed with -1701 (tenant not registered with the master)"
    assert store_probe.describe(store_probe.TENANT_QUOTA_EXCEEDED) == "tenant quota exceeded"
    assert store_probe.describe(-12345) == "see mooncake-store/include/types.h"


def test_mooncake_is_imported_lazily() -> None:
    # The launcher imports these in every role image; only roles that use the store have the native wheel.
    for module in (store_probe, master, store_client, mooncake):
        tree = ast.parse(Path(str(module.__file__)).read_text())
        top_level = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
        names = [a.name for n in top_level if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in top_level if isinstance(n, ast.ImportFrom)]
        assert not [name for name in names if name.split(".")[0] == "mooncake"], module.__name__


@pytest.mark.parametrize(
    ("body", "ready"),
    [
        (b'{"status":"ok","role":"leader","ha_state":"serving","service_ready":true}', True),
        (b'{"status":"ok","role":"standby","ha_state":"standby","service_ready":false}', False),
        (b'{"status":"ok","role":"leader","ha_state":"leader_warmup","service_ready":false}', False),
        (b'{"status":"ok"}', True),  # a master too old to report readiness
        (b"OK", True),
    ],
)
def test_health_bodies_that_mean_serving(body: bytes, ready: bool) -> None:
    assert store_probe.service_ready(body) is ready
