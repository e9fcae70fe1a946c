"""spec.model.modalities: what the model takes decides what the proxy's transfer canaries carry (an audio-only
model refuses images), and a list with neither image nor audio is refused naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_connectors.config.bundle import RoleBundle
from epd_connectors.config.roles import Role
from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner, parse_spec
from epd_operator.render import render_desired
from tests.unit.operator.bundles import bundles_of

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
OWNER = Owner(name="au", namespace="serving", uid="00000000-0000-4000-8000-000000000005")


def spec_of(example: str, modalities: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = copy.deepcopy(yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text())["spec"])
    if modalities is not None:
        spec["model"]["modalities"] = modalities
    return spec


def proxy_bundle(spec: dict[str, Any]) -> RoleBundle:
    desired = render_desired(OWNER, parse_spec(spec), OperatorDefaults())
    (proxy,) = [bundle for bundle in bundles_of(desired).values() if bundle.role == Role.PROXY]
    return proxy


@pytest.mark.parametrize(
    ("modalities", "media"),
    [(None, None), (["image"], None), (["image", "audio"], None), (["audio"], "audio"), (["audio", "video"], "audio")],
)
def test_the_canary_carries_audio_only_for_a_model_that_takes_audio_and_no_images(
    modalities: list[str] | None, media: str | None
) -> None:
    bundle = proxy_bundle(spec_of("local-e-pd", modalities))
    assert bundle.proxy is not None and bundle.proxy.canary_media == media


def test_the_audio_example_asks_for_audio_canaries() -> None:
    bundle = proxy_bundle(spec_of("local-e-pd-audio"))
    assert bundle.proxy is not None and bundle.proxy.canary_media == "audio"
    assert '"canary_media"' not in proxy_bundle(spec_of("local-e-pd")).to_json(), "image models' bundles unchanged"


@pytest.mark.parametrize("modalities", [["video"], []])
def test_modalities_without_image_or_audio_are_refused_naming_the_field(modalities: list[str]) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(spec_of("local-e-pd", modalities))
    assert any("spec.model.modalities" in problem for problem in caught.value.problems), caught.value.problems
