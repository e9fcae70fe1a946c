"""Generate the EPDDeployment CustomResourceDefinition from the API models (the one source of the schema).

Pydantic emits JSON Schema (draft 2020-12, with $refs); a CRD needs an inlined, structural OpenAPI v3 schema.
`structural_schema` does that translation; `render_crd` adds names, printer columns and the subresource.
"""

from __future__ import annotations

import copy
from typing import Any

from epd_connectors.config.roles import Role
from epd_operator.api import constants as c
from epd_operator.api import kube as k
from epd_operator.api._base import BYTE_SIZE_FORMAT, BYTE_SIZE_MARK, size_text
from epd_operator.api.spec import EPDDeploymentSpec
from epd_operator.api.status import EPDDeploymentStatus

_DROP = frozenset({"title", "$defs", "additionalProperties_false", "discriminator"})


def structural_schema(model: type[Any]) -> dict[str, Any]:
    """The model's validation schema, inlined and converted to what the API server accepts."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    converted: dict[str, Any] = _convert(raw, raw.get("$defs", {}))
    return converted


def _convert(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_convert(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = _without_null(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    out: dict[str, Any] = {}
    if node.get(BYTE_SIZE_MARK):
        node = {k: v for k, v in node.items() if k != BYTE_SIZE_MARK}
        node["description"] = f"{node.get('description', '')} {BYTE_SIZE_FORMAT}".strip()
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "additionalProperties" and value is False:
            continue  # the API server prunes unknown fields itself; `false` is not structural
        if key == "exclusiveMinimum":
            out["minimum"] = value
            out["exclusiveMinimum"] = True
            continue
        if key == "description" and isinstance(value, str):
            out[key] = " ".join(value.split())  # docstrings wrap; kubectl explain re-wraps
            continue
        if key == "const":
            out["enum"] = [value]
            continue
        if key == "default":
            if value is None:
                continue
            if node.get("type") == "string" and isinstance(value, int) and not isinstance(value, bool):
                out[key] = size_text(value)  # a byte size: an int in Python, its string spelling in the CRD
                continue
            # Object defaults become {} so the API server applies the nested field defaults itself.
            out["default"] = {} if isinstance(value, dict) and node.get("type") == "object" else value
            continue
        out[key] = _convert(value, defs)
    if "properties" in out and "type" not in out:
        out["type"] = "object"
    return out


def _without_null(node: dict[str, Any]) -> dict[str, Any]:
    """`X | None` arrives as anyOf [X, null]; in a CRD optional means "not required", so keep X."""
    options = node.get("anyOf")
    if not isinstance(options, list):
        return node
    kept = [o for o in options if o != {"type": "null"}]
    if len(kept) == len(options):
        return node
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    if len(kept) == 1:
        return {**kept[0], **rest}
    return {**rest, "anyOf": kept}


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Encoders", "type": "string", "jsonPath": ".status.rolesReady.encoder"},
    {"name": "Prefill", "type": "string", "jsonPath": ".status.rolesReady.prefill"},
    {"name": "Decode", "type": "string", "jsonPath": ".status.rolesReady.decode"},
    # Without a prefill pool the language model runs as combined prefill+decode instances.
    {"name": "PD", "type": "string", "jsonPath": ".status.rolesReady.pd"},
    {"name": "Store", "type": "string", "jsonPath": ".status.rolesReady.store"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "priority": 1},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


NAME_RULE: dict[str, str] = {
    # CEL at the root sees metadata.name: a name no child can carry is refused at apply, with the one limit.
    "rule": f"size(self.metadata.name) <= {k.NAME_MAX} && self.metadata.name.matches(r'{k.DNS_1035}')",
    "message": f"metadata.name: an EPDDeployment name is at most {k.NAME_MAX} characters of lowercase letters, "
    "digits and '-', starting with a letter and ending alphanumeric (no dots: it names Services, and its "
    f"store-client StatefulSet '<name>-{Role.STORE_CLIENT}' may have at most {k.STATEFULSET_NAME_MAX}). "
    "Fix: use a shorter name of that form",
}


def render_crd() -> dict[str, Any]:
    """The complete CRD object."""
    spec_schema = structural_schema(EPDDeploymentSpec)
    spec_schema["description"] = "What to deploy: the model, the store, and each role."
    status_schema = structural_schema(EPDDeploymentStatus)
    status_schema["description"] = "What the operator observed and derived."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{c.PLURAL}.{c.GROUP}",
            "labels": {c.LABEL_NAME: "epd-operator", c.LABEL_PART_OF: "epd-operator"},
        },
        "spec": {
            "group": c.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": c.KIND,
                "listKind": f"{c.KIND}List",
                "plural": c.PLURAL,
                "singular": c.SINGULAR,
                "shortNames": list(c.SHORT_NAMES),
                "categories": ["all"],
            },
            "versions": [
                {
                    "name": c.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An encoder-disaggregated (E/P/D) multimodal vLLM deployment "
                            "with a Mooncake store.",
                            "required": ["spec"],
                            "x-kubernetes-validations": [NAME_RULE],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                }
            ],
        },
    }
