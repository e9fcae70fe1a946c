"""E+PD with ECExampleConnector over a shared folder: one encoder and its PD consumer, shared by the modules of
this folder and stopped when the last of them is done (so the next folder's instances never overlap them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from epd_connectors.config.ec_transfer import ECExampleConnectorConfig
from tests.e2e.conftest import TIMINGS, Launcher, VllmInstance, tiny_server, vllm_bundle


@dataclass
class Fleet:
    """The session's baseline, and an encoder with its PD consumer (ECExampleConnector over a shared folder)."""

    baseline: VllmInstance
    encoder: VllmInstance
    pd: VllmInstance
    ec_folder: Path


@pytest.fixture(scope="package")
def fleet(launcher: Launcher, baseline_started: VllmInstance, tiny_model: Path) -> Iterator[Fleet]:
    """Start the encoder and the PD at once (with the session's baseline when this folder runs first: about 60 s
    for the three on 2 idle cores); stop both when the folder is done."""
    ec_folder = launcher.workdir / "ec-shared"
    ec_folder.mkdir(exist_ok=True)
    started = time.monotonic()
    shared = {"shared_storage_path": str(ec_folder)}
    encoder = launcher.start(
        "encoder",
        vllm_bundle(
            "encoder",
            tiny_server(tiny_model, "encoder"),
            ECExampleConnectorConfig(ec_role="ec_producer", ec_connector_extra_config=shared),
        ),
    )
    # The PD also takes image items rewritten to image_embeds (grid) + uuid (mm hash): as an EC consumer its
    # VllmServerConfig renders --enable-mm-embeds itself.
    pd = launcher.start(
        "pd",
        vllm_bundle(
            "pd",
            tiny_server(tiny_model, "pd"),
            ECExampleConnectorConfig(ec_role="ec_consumer", ec_connector_extra_config=shared),
        ),
    )
    try:
        launcher.wait_healthy([baseline_started, encoder, pd])
        TIMINGS.add("ec_example: encoder and PD healthy (wall)", time.monotonic() - started)
        yield Fleet(baseline=baseline_started, encoder=encoder, pd=pd, ec_folder=ec_folder)
    finally:
        launcher.stop_each([encoder, pd])
