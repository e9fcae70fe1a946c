"""Hypothesis: a broken bundle never crashes the parser and never passes; only ConfigError comes out."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epd_connectors.config.base import ConfigError
from epd_connectors.config.bundle import parse_bundle

from .conftest import sample_bundle_data

pytestmark = pytest.mark.unit

SAMPLES = sample_bundle_data()
_NOT_A_SCALAR = st.sampled_from([{"unexpected": 1}, [1, 2], {"nested": {"deep": []}}])


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a scalar leaf."""
    if isinstance(node, dict):
        return [p for key, value in node.items() for p in _paths(value, (*prefix, key))]
    if isinstance(node, list):
        return [p for i, value in enumerate(node) for p in _paths(value, (*prefix, i))]
    return [prefix]


def _dicts(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a mapping (where an unknown key can be added)."""
    if isinstance(node, dict):
        return [prefix, *(p for key, value in node.items() for p in _dicts(value, (*prefix, key)))]
    if isinstance(node, list):
        return [p for i, value in enumerate(node) for p in _dicts(value, (*prefix, i))]
    return []


def _at(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


def _expect_refusal(data: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_bundle(json.dumps(data))
    assert str(info.value).strip(), "a refusal must say why"


@settings(max_examples=150, deadline=None)
@given(role=st.sampled_from(sorted(SAMPLES)), data=st.data(), bad=_NOT_A_SCALAR)
def test_a_scalar_replaced_by_a_structure_is_refused(role: str, data: st.DataObject, bad: Any) -> None:
    bundle = copy.deepcopy(SAMPLES[role])
    paths = [p for p in _paths(bundle) if p[0] != "env"]
    path = data.draw(st.sampled_from(paths))
    _at(bundle, path[:-1])[path[-1]] = bad
    _expect_refusal(bundle)


@settings(max_examples=150, deadline=None)
@given(role=st.sampled_from(sorted(SAMPLES)), data=st.data(), key=st.text(min_size=1, max_size=12))
def test_an_unknown_key_anywhere_is_refused(role: str, data: st.DataObject, key: str) -> None:
    bundle = copy.deepcopy(SAMPLES[role])
    paths = [p for p in _dicts(bundle) if not p or p[0] != "env"]
    path = data.draw(st.sampled_from(paths))
    target = _at(bundle, path)
    if key in target:
        key = key + "_unknown"
    target[key] = 1
    _expect_refusal(bundle)


@settings(max_examples=100, deadline=None)
@given(role=st.sampled_from(sorted(SAMPLES)), other=st.sampled_from(sorted(SAMPLES)))
def test_a_bundle_relabelled_as_another_role_is_refused(role: str, other: str) -> None:
    if role == other:
        return
    bundle = copy.deepcopy(SAMPLES[role])
    bundle["role"] = other
    _expect_refusal(bundle)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
)


@settings(max_examples=200, deadline=None)
@given(_JSON)
def test_arbitrary_json_never_crashes_and_never_passes(value: Any) -> None:
    _expect_refusal(value)
