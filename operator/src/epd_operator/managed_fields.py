"""What a child's managedFields say: which of its fields are ours, and which list entries someone else added.

The API server records, per field manager, the set of fields it owns (`metadata.managedFields`, one entry per
manager and operation). Everything the operator writes goes through server-side apply under one manager
(`constants.FIELD_MANAGER`), so its entry is exactly the set of rendered fields nobody else has changed since.
Pure functions over plain dicts: apply decides with them whether to send, and how to repair a refused apply.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

from epd_operator.api import constants as c


def held(live: dict[str, Any]) -> str:
    """What changes when anyone but us changes or removes a field we own: our entry in managedFields.

    Whoever changes the value of a field takes it over (the API server moves the field to their entry), and a
    removed field leaves every entry; status updates, a controller's annotation or a field someone adds leave
    our entry as it is, so none of those look like drift. Without such an entry (an API server that keeps no
    managedFields, a test's fake) the generation stands in (it moves on spec changes only) or, for kinds
    without one, the resourceVersion. The uid makes a re-created object count as changed.
    """
    meta = live.get("metadata", {})
    ours = [(e.get("apiVersion"), e.get("fieldsV1")) for e in meta.get("managedFields") or [] if _is_ours(e)]
    if ours:
        version = f"f{_digest(ours)}"
    elif meta.get("generation") is not None:
        version = f"g{meta['generation']}"
    else:
        version = f"rv{meta.get('resourceVersion')}"
    return f"{meta.get('uid')}:{version}"


def _is_ours(entry: dict[str, Any]) -> bool:
    """Our server-side apply entry (the operator never writes a child's status)."""
    manager, operation = entry.get("manager"), entry.get("operation")
    return manager == c.FIELD_MANAGER and operation == "Apply" and not entry.get("subresource")


def owns(live: dict[str, Any], path: Sequence[str]) -> bool:
    """Whether our server-side apply entry owns the plain (not keyed-list) field at `path`."""
    for entry in live.get("metadata", {}).get("managedFields") or []:
        if not _is_ours(entry):
            continue
        fields: Any = entry.get("fieldsV1") or {}
        for name in path:
            fields = fields.get(f"f:{name}") if isinstance(fields, dict) else None
        if fields is not None:
            return True
    return False


Step = str | dict[str, Any]
"""One step into an object: a field name, or the key fields of an entry of a keyed list."""


def foreign_entries(live: dict[str, Any], desired: dict[str, Any]) -> list[str]:
    """JSON pointers of the keyed-list entries another manager added to lists we render, with keys no desired
    entry has (last index first, so they can be removed in order); entries they only edited are not among them.

    The keys come from the other managers' managedFields (`k:{"port":8080,"protocol":"TCP"}`); status is theirs.
    """
    found: dict[str, list[str | int]] = {}
    for entry in live.get("metadata", {}).get("managedFields") or []:
        if _is_ours(entry) or entry.get("subresource"):
            continue
        for path, key in _keyed_entries(entry.get("fieldsV1") or {}, ()):
            rendered = _resolve(desired, path)
            if not isinstance(rendered, list) or _find(rendered, key) is not None:
                continue  # not a list we render, or an entry we render too
            parts = _locate(live, (*path, key))
            if parts is not None:
                found[_pointer(parts)] = parts
    # Within one list the later entry goes first, so the indices of the rest still hold.
    return sorted(
        found, key=lambda p: [(0, x, "") if isinstance(x, int) else (1, 0, x) for x in found[p]], reverse=True
    )


def _keyed_entries(fields: dict[str, Any], path: tuple[Step, ...]) -> Iterator[tuple[tuple[Step, ...], dict[str, Any]]]:
    """(path of the list, key of the entry) for every keyed-list entry a fieldsV1 tree names, nested ones too."""
    for name, sub in fields.items():
        if name.startswith("f:"):
            yield from _keyed_entries(sub or {}, (*path, name[2:]))
        elif name.startswith("k:"):
            key: dict[str, Any] = json.loads(name[2:])
            yield path, key
            yield from _keyed_entries(sub or {}, (*path, key))


def _find(items: list[Any], key: dict[str, Any]) -> int | None:
    for index, item in enumerate(items):
        if isinstance(item, dict) and all(item.get(k) == v for k, v in key.items()):
            return index
    return None


def _resolve(obj: Any, steps: Sequence[Step]) -> Any:
    for step in steps:
        if isinstance(step, str):
            obj = obj.get(step) if isinstance(obj, dict) else None
        else:
            index = _find(obj, step) if isinstance(obj, list) else None
            obj = obj[index] if index is not None else None
        if obj is None:
            return None
    return obj


def _locate(obj: Any, steps: Sequence[Step]) -> list[str | int] | None:
    """The path of `steps` in `obj`, list entries by index; None when it is not there."""
    parts: list[str | int] = []
    for step in steps:
        if isinstance(step, str):
            if not isinstance(obj, dict) or step not in obj:
                return None
            obj = obj[step]
            parts.append(step)
        else:
            index = _find(obj, step) if isinstance(obj, list) else None
            if index is None:
                return None
            obj = obj[index]
            parts.append(index)
    return parts


def _pointer(parts: Sequence[str | int]) -> str:
    """A JSON pointer (RFC 6901)."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
