"""Bytes go in and come out of a real Mooncake store set up only from the configs our models render."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from epd_connectors import store_probe
from epd_connectors.config.mooncake import MooncakeStoreConfig, StoreMode

if TYPE_CHECKING:
    from .conftest import Mooncake

pytestmark = pytest.mark.store

MiB = 1024**2


def test_standalone_requester_stores_in_the_owner(mooncake: Mooncake) -> None:
    master = mooncake.master()
    owner = mooncake.client(master, global_segment_size="128 MiB")
    # The requester reads exactly the JSON vLLM would get through MOONCAKE_CONFIG_PATH.
    text = owner.config.requester_config(local_buffer_size="32 MiB").to_json()
    config = MooncakeStoreConfig.from_json(text)
    assert config.mode is StoreMode.STANDALONE_STORE
    assert config.global_segment_size == 0

    writer = mooncake.requester(config)
    value = os.urandom(MiB)
    result = store_probe.probe(writer, "standalone/1", value)
    assert result.size == MiB
    # The requester contributes nothing, so the pool is the owner's alone: the value lives there.
    assert store_probe.master_capacity_bytes(master.metrics_url) == 128 * MiB

    reader = mooncake.requester(config)
    assert reader.get("standalone/1") == value
    assert reader.get("standalone/missing") == b""


def test_put_on_an_existing_key_keeps_the_old_value(mooncake: Mooncake) -> None:
    master = mooncake.master()
    owner = mooncake.client(master, global_segment_size="64 MiB")
    store = mooncake.requester(owner.config.requester_config(local_buffer_size="16 MiB"))
    assert store.put("k", b"first") == 0
    store.put("k", b"second")
    assert store.get("k") == b"first"


def test_embedded_requesters_share_their_segments(mooncake: Mooncake) -> None:
    master = mooncake.master()
    config = master.store_config(mode="embedded", global_segment_size="64 MiB", local_buffer_size="32 MiB")
    first = mooncake.requester(MooncakeStoreConfig.from_json(config.to_json()))
    second = mooncake.requester(config)
    assert store_probe.master_capacity_bytes(master.metrics_url) == 2 * 64 * MiB

    value = os.urandom(4 * MiB)
    store_probe.probe(first, "embedded/1", value)
    assert second.get("embedded/1") == value


def test_http_metadata_server_works_as_rendered(mooncake: Mooncake) -> None:
    master = mooncake.master(enable_http_metadata_server=True)
    owner = mooncake.client(master, global_segment_size="64 MiB")
    assert owner.config.metadata_server == f"http://127.0.0.1:{master.config.http_metadata_server_port}/metadata"
    store = mooncake.requester(owner.config.requester_config(local_buffer_size="16 MiB"))
    store_probe.probe(store, "http-metadata/1", b"x" * 1000)


def test_a_full_pool_is_reported_not_raised(mooncake: Mooncake) -> None:
    master = mooncake.master()
    owner = mooncake.client(master, global_segment_size="16 MiB")
    store = mooncake.requester(owner.config.requester_config(local_buffer_size="32 MiB"))
    with pytest.raises(store_probe.StoreError) as info:
        store_probe.probe(store, "too-big", b"x" * (24 * MiB))
    assert info.value.code == store_probe.NO_AVAILABLE_HANDLE
    assert "no space in the pool" in str(info.value)
