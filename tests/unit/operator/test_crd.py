"""The committed CRD is exactly what the API models generate, and it carries what kubectl users rely on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from epd_operator.api import kube
from epd_operator.api.__main__ import crd_yaml
from epd_operator.api.crd import render_crd
from epd_operator.api.reference import main as reference_main
from epd_operator.api.reference import render_reference
from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import render_desired

pytestmark = pytest.mark.unit

CRD_FILE = Path(__file__).resolve().parents[3] / "crds" / "epddeployments.yaml"
REFERENCE_FILE = Path(__file__).resolve().parents[3] / "docs" / "crd-reference.md"


def test_committed_crd_equals_the_generated_one() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), "crds/ is stale: run `make crds` and commit the result"


def test_the_crd_reference_is_fresh_and_the_lint_check_fails_a_stale_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert reference_main(["--check", str(REFERENCE_FILE)]) == 0, "docs/crd-reference.md is stale: run `make crds`"
    stale = tmp_path / "crd-reference.md"
    stale.write_text(REFERENCE_FILE.read_text().replace("Weights revision", "Weight revision"))
    assert reference_main(["--check", str(stale)]) == 1
    assert "run `make crds`" in capsys.readouterr().err


def test_the_crd_reference_names_every_spec_field_and_every_operator_only_rule() -> None:
    page = render_reference()
    schema = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in _walk(schema):
        if path.endswith(".properties"):
            section = "spec" + path.removesuffix(".properties").replace(".properties.", ".").replace(".items", "[]")
            assert f"## `{section}`" in page, section
            for name in node:
                assert f"| `{name}`" in page, f"{section}.{name}"
    assert "| `spec.model.mmProcessorCacheGB` | cross-encoder reuse needs the processor cache |" in page


def _walk(node: object, path: str = "") -> list[tuple[str, dict[str, object]]]:
    found: list[tuple[str, dict[str, object]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, value in node.items():
            found += _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _walk(value, f"{path}[{i}]")
    return found


def test_schema_is_structural_enough_for_the_api_server() -> None:
    schema = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node, path
        assert "title" not in node or path.endswith(".properties"), path
        if "anyOf" in node:
            pytest.fail(f"{path}: anyOf is not structural")


def test_a_rule_on_a_defaulted_object_reads_only_what_its_default_holds_or_checks_has_first() -> None:
    """The API server evaluates an object's rules on its `{}` default, before nested defaults fill it, and refuses
    the whole CRD when a rule reads a key the default lacks ("no such key")."""
    schema = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    checked = 0
    for path, node in _walk(schema):
        default = node.get("default")
        if not isinstance(default, dict):
            continue
        for rule in node.get("x-kubernetes-validations", []):  # type: ignore[attr-defined]
            checked += 1
            read = set(re.findall(r"self\.(\w+)\b(?!\()", rule["rule"]))  # fields, not macros such as self.all(
            for field in read - set(default):
                assert f"has(self.{field})" in rule["rule"], f"{path}: {rule['rule']!r} reads {field} unguarded"
    assert checked, "no defaulted object carries a rule: the check checked nothing"


def test_every_spec_field_has_a_description_for_kubectl_explain() -> None:
    spec = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    fields = [
        (f"{path}.{name}", field)
        for path, node in _walk(spec)
        if isinstance(node.get("properties"), dict)
        for name, field in node["properties"].items()  # type: ignore[attr-defined]
    ]
    assert len(fields) > 80
    assert [path for path, field in fields if "description" not in field] == []


def test_names_columns_and_status_subresource() -> None:
    version = render_crd()["spec"]["versions"][0]
    names = render_crd()["spec"]["names"]
    assert names["shortNames"] == ["epd"]
    assert version["subresources"] == {"status": {}}
    assert [col["name"] for col in version["additionalPrinterColumns"] if "priority" not in col] == [
        "Ready",
        "Encoders",
        "Prefill",
        "Decode",
        "PD",
        "Store",
        "Age",
    ]


def test_the_name_limit_is_the_one_derive_names_needs() -> None:
    spec = yaml.safe_load((CRD_FILE.parents[1] / "examples" / "e-p-d-store-offload.yaml").read_text())["spec"]
    spec["prefill"]["additionalPools"][0]["name"] = "p" * kube.POOL_NAME_MAX
    at_limit = Owner(name="n" * kube.NAME_MAX, namespace="serving", uid="u")
    names = [o["metadata"]["name"] for o in render_desired(at_limit, parse_spec(spec), OperatorDefaults()).objects]
    assert max(len(n) for n in names if not n.endswith("-bundle")) == kube.SERVICE_NAME_MAX
    with pytest.raises(ValueError, match=r"metadata\.name"):
        render_desired(
            Owner(name="n" * (kube.NAME_MAX + 1), namespace="serving", uid="u"), parse_spec(spec), OperatorDefaults()
        )


def test_the_crd_refuses_long_names_reserved_pools_and_ha_with_a_metadata_server() -> None:
    schema = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "size(self.metadata.name) <= 39" in schema["x-kubernetes-validations"][0]["rule"]
    master = schema["properties"]["spec"]["properties"]["store"]["properties"]["master"]
    ha = master["properties"]["ha"]
    assert ha["required"] == ["etcdEndpoints"] and ha["properties"]["replicas"]["minimum"] == 2
    assert ha["properties"]["etcdEndpoints"]["minItems"] == 1
    assert any("httpMetadataServer" in rule["rule"] for rule in master["x-kubernetes-validations"])
    pool = schema["properties"]["spec"]["properties"]["prefill"]["properties"]["additionalPools"]
    assert (
        pool["x-kubernetes-list-type"] == "map" and pool["items"]["properties"]["name"]["pattern"] == "^[a-z][a-z0-9]*$"
    )
    sizes = schema["properties"]["spec"]["properties"]["store"]["properties"]["clients"]["properties"]["segmentSize"]
    assert sizes["type"] == "string" and "byte size" in sizes["description"]
