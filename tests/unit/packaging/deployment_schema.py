"""The epd-deployment chart's values.schema.json, derived from the CRD so the two can never disagree.

The chart's values are the EPDDeployment spec (plus a few chart-only keys), so their schema is the CRD's spec
schema turned into plain JSON Schema: Kubernetes' extensions dropped (CEL rules stay with the API server,
which checks them on install), int-or-string spelled as a type list, OpenAPI 3.0's boolean exclusive
bounds as JSON Schema's numeric ones, and every object closed
(`additionalProperties: false`) so that a misspelt value fails at `helm install` instead of being pruned.

    python -m tests.unit.packaging.deployment_schema     # rewrites charts/epd-deployment/values.schema.json

tests/unit/packaging/test_charts.py fails when the file differs from what this produces.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]
CRD_FILE = REPO / "crds" / "epddeployments.yaml"
SCHEMA_FILE = REPO / "charts" / "epd-deployment" / "values.schema.json"

CHART_KEYS: dict[str, Any] = {
    "global": {"type": "object", "description": "Helm's global values (unused)."},
    "nameOverride": {
        "type": "string",
        "description": "Name of the EPDDeployment; default: the release name.",
        "pattern": "^([a-z]([-a-z0-9]*[a-z0-9])?)?$",
        "maxLength": 40,
    },
    "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Extra labels."},
    "annotations": {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": "Extra annotations.",
    },
}
"""Values that are not part of the spec."""

_DROPPED = ("default", "x-kubernetes-validations", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """One CRD (structural OpenAPI v3) schema node as JSON Schema."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "properties":  # a map of names (any name, even "default") to schemas
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [to_json_schema(x) for x in value]
        else:
            out[key] = value
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(node.get(exclusive), bool):  # OpenAPI 3.0's flag; JSON Schema wants the bound itself
            flag = out.pop(exclusive)
            if flag and bound in out:
                out[exclusive] = out.pop(bound)
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if "properties" in node and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


def values_schema(crd: dict[str, Any]) -> dict[str, Any]:
    """The whole values.schema.json for a CRD document."""
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    properties = {**CHART_KEYS, **to_json_schema(spec)["properties"]}
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": f"epd-deployment chart values: the {crd['spec']['names']['kind']} spec",
        "description": "Generated from crds/epddeployments.yaml by tests/unit/packaging/deployment_schema.py.",
        "type": "object",
        "additionalProperties": False,
        "required": list(spec.get("required", [])),
        "properties": properties,
    }


def render(crd_file: pathlib.Path = CRD_FILE) -> str:
    """The file's text, as written."""
    return json.dumps(values_schema(yaml.safe_load(crd_file.read_text())), indent=2) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(render())
    print(f"wrote {SCHEMA_FILE.relative_to(REPO)}")
