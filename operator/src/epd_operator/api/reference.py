"""docs/crd-reference.md, generated from the CRD the API models generate (`make crds`; `make lint` fails when stale).

`python -m epd_operator.api.reference` prints it; `--check PATH` exits 1 with the fix when PATH differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from epd_operator.api._rules import Rule, RuledModel
from epd_operator.api.crd import render_crd
from epd_operator.api.spec import EPDDeploymentSpec

HEADER = """\
# EPDDeployment reference

<!-- Generated from epd_operator.api by `make crds`; do not edit by hand. `make lint` fails when it is stale. -->

Every field of `epddeployments.epd.serving.io/v1alpha1`, from the same models that generate
[crds/epddeployments.yaml](../crds/epddeployments.yaml). `kubectl explain epddeployment.spec.<field>` shows the
same descriptions on a cluster. A field's checks run at the earliest point they can: the API server refuses what
the schema and its CEL rules catch at `kubectl apply`; the rules at the end are checked by the operator, which
sets `Valid=False` naming the field and the fix and leaves running children untouched.
"""


def render_reference(crd: dict[str, Any] | None = None) -> str:
    """The reference page's exact Markdown."""
    root = (crd or render_crd())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    parts = [HEADER, _name_section(root)]
    for top in ("spec", "status"):
        parts += [_section(path, node) for path, node in _objects(top, root["properties"][top])]
    parts.append(_operator_rules(_python_only_rules()))
    return "\n".join(parts)


def _name_section(root: dict[str, Any]) -> str:
    rules = "\n".join(f"- {_rule_text(rule)}" for rule in root.get("x-kubernetes-validations", []))
    return (
        f"## `metadata.name`\n\nThe deployment's name: every child's name and cache prefix start with it.\n\n{rules}\n"
    )


def _objects(path: str, node: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each object of the schema with the path that reaches it, parents before children."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        inner = _element(child)
        suffix = "[]" if child.get("type") == "array" else ""
        if inner.get("properties"):
            yield from _objects(f"{path}.{name}{suffix}", inner)


def _element(node: dict[str, Any]) -> dict[str, Any]:
    items = node.get("items")
    return items if node.get("type") == "array" and isinstance(items, dict) else node


def _section(path: str, node: dict[str, Any]) -> str:
    lines = [f"## `{path}`", ""]
    if node.get("description"):
        lines += [node["description"], ""]
    lines += [f"- {_rule_text(rule)}" for rule in node.get("x-kubernetes-validations", [])]
    if node.get("x-kubernetes-validations"):
        lines.append("")
    fields = node.get("properties", {})
    if fields:
        required = set(node.get("required", []))
        lines += ["| Field | Type | Default | Description and checks |", "| --- | --- | --- | --- |"]
        for name, child in fields.items():
            name_cell = f"`{name}`" + (" (required)" if name in required else "")
            cells = [name_cell, _type(child), _default(child), _described(child, f"{path}.{name}")]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "integer or string"
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (any fields)"
    kind = str(node.get("type", "any"))
    if kind == "array":
        return f"list of {_type(_element(node))}"
    values = node.get("additionalProperties")
    if kind == "object" and isinstance(values, dict):
        return f"map of string to {_type(values)}"
    return kind


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return ""
    value = node["default"]
    if value == {} and node.get("type") == "object":
        return "its fields' defaults"
    return f"`{json.dumps(value)}`"


def _described(node: dict[str, Any], path: str) -> str:
    element = _element(node)
    text = [str(node.get("description", ""))]
    if element.get("properties"):
        # The child's section lists its own rules; the row only points there.
        text.append(f"See [`{path}{'[]' if element is not node else ''}`]({_anchor(path, node)}).")
        checks = _checks(node) if element is not node else []
    else:
        checks = _checks(node) + [f"each item {c}" for c in _checks(element) if element is not node]
    refusals = [
        _rule_text(rule) + "." for rule in node.get("x-kubernetes-validations", []) if not element.get("properties")
    ]
    if checks:
        text.append("Checks: " + "; ".join(checks) + ".")
    return " ".join(t for t in text + refusals if t)


def _checks(node: dict[str, Any]) -> list[str]:
    found: list[str] = []
    if "enum" in node:
        found.append("one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"]))
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None:
        found.append(f"{'above' if node.get('exclusiveMinimum') is True else 'at least'} {low}")
    if high is not None:
        found.append(f"at most {high}")
    if node.get("type") == "string":
        lengths = (node.get("minLength", 0), node.get("maxLength"))
        if lengths[1] is not None:
            found.append(
                f"{lengths[0]} to {lengths[1]} characters" if lengths[0] else f"at most {lengths[1]} characters"
            )
        elif lengths[0]:
            found.append(f"at least {lengths[0]} characters")
    if "maxItems" in node:
        found.append(f"at most {node['maxItems']} items")
    if "maxProperties" in node:
        found.append(f"at most {node['maxProperties']} entries")
    if "pattern" in node:
        found.append(f"matches `{node['pattern']}`")
    if node.get("x-kubernetes-list-type") == "map":
        found.append("keyed by " + ", ".join(f"`{k}`" for k in node.get("x-kubernetes-list-map-keys", [])))
    return found


def _rule_text(rule: dict[str, str]) -> str:
    return f"Refused at apply: {rule['message']}"


def _anchor(path: str, node: dict[str, Any]) -> str:
    """GitHub's heading anchor of the child's section (`## \\`spec.encoder\\``)."""
    heading = path + ("[]" if node.get("type") == "array" else "")
    return "#" + "".join(ch for ch in heading.lower() if ch.isalnum() or ch in "-_")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _python_only_rules() -> list[Rule[Any]]:
    """Rules the API server cannot check, from every ruled model the spec reaches."""
    found: list[Rule[Any]] = []
    pending: list[type[Any]] = [EPDDeploymentSpec]
    seen: set[type[Any]] = set()
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        if issubclass(model, RuledModel):
            found += [rule for rule in model.RULES if rule.cel is None]
        for field in model.model_fields.values():
            pending += [t for t in _model_types(field.annotation)]
    return sorted(found, key=lambda rule: (rule.field, rule.problem))


def _model_types(annotation: Any) -> Iterator[type[Any]]:
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        yield annotation
    for arg in getattr(annotation, "__args__", ()):
        yield from _model_types(arg)
    for meta in getattr(annotation, "__metadata__", ()):
        yield from _model_types(meta)


def _operator_rules(rules: list[Rule[Any]]) -> str:
    lines = [
        "## Checked by the operator",
        "",
        "Rules the API server cannot check: the operator sets `Valid=False` with the field and the fix, and",
        "changes nothing that runs. Render adds the checks that need derived values (names, ports, pools, vLLM",
        "flags the operator owns); docs/troubleshooting.md lists every condition reason.",
        "",
        "| Field | Refused when | Fix |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{rule.field}` | {_cell(rule.problem)} | {_cell(rule.fix)} |" for rule in rules]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", type=Path, metavar="PATH", help="exit 1 when PATH is not the generated page")
    args = parser.parse_args(argv)
    page = render_reference()
    if args.check is None:
        sys.stdout.write(page)
        return 0
    if args.check.is_file() and args.check.read_text() == page:
        return 0
    print(f"{args.check} is stale: run `make crds` to regenerate it from the API models", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
