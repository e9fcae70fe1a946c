"""The charts' files against their sources, without helm: the CRD has one source, the generated values schema
is current, and the chart's defaults are the operator's and the images'. (Rendering with helm is in
tests/cluster/test_chart_render.py.)"""

from __future__ import annotations

import json
import pathlib
import tomllib
from typing import Any

import pytest
import yaml

from epd_operator.api.resource import OperatorDefaults
from tests.unit.packaging import deployment_schema, image_list

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[3]
OPERATOR_CHART = REPO / "charts" / "epd-operator"
DEPLOYMENT_CHART = REPO / "charts" / "epd-deployment"


def load(path: pathlib.Path) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(path.read_text())
    return found


def test_the_operator_chart_crd_is_crds_file_itself() -> None:
    """One source: the chart's CRD is a symlink to crds/ (helm lint, package and install follow it; a packaged
    chart holds the file's content), so `make crds` updates both and nothing can be copied by hand."""
    link = OPERATOR_CHART / "crds" / "epddeployments.yaml"
    assert link.is_symlink(), "charts/epd-operator/crds/epddeployments.yaml must stay a symlink to crds/"
    assert link.resolve() == (REPO / "crds" / "epddeployments.yaml").resolve()
    assert not pathlib.Path(link.readlink()).is_absolute(), "relative, so it resolves in any checkout"


def test_deployment_values_schema_is_generated_from_the_crd() -> None:
    current = (DEPLOYMENT_CHART / "values.schema.json").read_text()
    assert current == deployment_schema.render(), (
        "charts/epd-deployment/values.schema.json is stale: run python -m tests.unit.packaging.deployment_schema"
    )


def test_deployment_defaults_fit_the_schema_keys() -> None:
    schema = json.loads((DEPLOYMENT_CHART / "values.schema.json").read_text())
    values = load(DEPLOYMENT_CHART / "values.yaml")
    assert set(values) <= set(schema["properties"])
    assert set(schema["required"]) <= set(values)


def test_operator_chart_defaults_are_the_operators() -> None:
    values, chart = load(OPERATOR_CHART / "values.yaml"), load(OPERATOR_CHART / "Chart.yaml")
    defaults = OperatorDefaults()
    images = values["defaults"]["images"]
    assert (images["vllm"], images["proxy"], images["mooncake"]) == (
        defaults.vllm_image,
        defaults.proxy_image,
        defaults.mooncake_image,
    )
    assert values["defaults"]["gpuResource"] == defaults.gpu_resource
    version = tomllib.loads((REPO / "operator" / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    assert f"{values['image']['repository']}:{chart['appVersion']}" == image_list.tags()["operator"]


def test_operator_values_are_all_in_its_schema() -> None:
    schema = json.loads((OPERATOR_CHART / "values.schema.json").read_text())
    values = load(OPERATOR_CHART / "values.yaml")
    assert set(values) <= set(schema["properties"])
    assert schema["additionalProperties"] is False
