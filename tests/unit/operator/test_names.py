"""Child names are unique across the EPDDeployments of a namespace by construction (derive.names.Names): every
rendered child is "<name>-<suffix>", every suffix starts with a role token, and no hyphen-tail of a suffix
does, so no suffix is "<something>-<another suffix>" and two deployments' children can never share a name."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.derive.names import ROLE_TOKENS, ROLES
from epd_operator.render import render_desired

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
OWNER = Owner(name="a", namespace="ns", uid="00000000-0000-4000-8000-000000000001")


def rich_specs() -> list[dict[str, Any]]:
    """Every example, plus the richest one with more pools and with per-node store clients (a DaemonSet):
    between them every role, kind and name pattern render produces."""
    specs = [yaml.safe_load(p.read_text())["spec"] for p in sorted(EXAMPLES.glob("*.yaml"))]
    richest = next(s for s in specs if (s.get("prefill") or {}).get("additionalPools"))
    pools = copy.deepcopy(richest)
    pools["prefill"]["additionalPools"] = [
        {"name": name, "replicas": 1, "tensorParallelSize": 2} for name in ("tp2", "x", "long7pool")
    ]
    per_node = copy.deepcopy(richest)
    per_node["store"]["clients"] = {"perNode": True}
    return [*specs, pools, per_node]


def suffixes() -> dict[str, set[str]]:
    """kind -> every suffix the rendered children of that kind have (after "<name>-")."""
    found: dict[str, set[str]] = {}
    for spec in rich_specs():
        objects = render_desired(OWNER, parse_spec(spec), OperatorDefaults(prometheus_url="http://p:9090")).objects
        keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
        assert len(keys) == len(set(keys)), "one render names two objects of a kind alike"
        for kind, name in keys:
            assert name.startswith(f"{OWNER.name}-"), f"{kind} {name}: not '<deployment name>-<suffix>'"
            found.setdefault(kind, set()).add(name.removeprefix(f"{OWNER.name}-"))
    return found


def tails(suffix: str) -> list[str]:
    """The proper hyphen-tails: "prefill-tp2-bundle" -> ["tp2-bundle", "bundle"]."""
    parts = suffix.split("-")
    return ["-".join(parts[i:]) for i in range(1, len(parts))]


def test_the_enumeration_covers_every_kind_and_role() -> None:
    found = suffixes()
    assert {"Deployment", "StatefulSet", "DaemonSet", "Service", "PodDisruptionBudget", "ConfigMap"} <= found.keys()
    assert {"NetworkPolicy", "ServiceAccount", "Role", "RoleBinding"} <= found.keys()
    assert set(ROLES) <= set().union(*found.values())
    assert {"prefill-tp2", "prefill-long7pool-bundle"} <= found["Deployment"] | found["ConfigMap"]


def test_every_suffix_starts_with_a_role_token_and_no_tail_does() -> None:
    found = suffixes()
    every = set().union(*found.values())
    for suffix in sorted(every):
        assert suffix.split("-")[0] in ROLE_TOKENS, f"{suffix!r} does not start with a role token"
        for tail in tails(suffix):
            # A tail starting with a role token could itself be a suffix of some spec: EPD "a" and EPD
            # "a-<head>" would then both want "a-<suffix>".
            assert tail.split("-")[0] not in ROLE_TOKENS, f"{suffix!r} has the tail {tail!r}"
            assert tail not in every


def test_the_issue_collision_is_one_a_tail_check_catches() -> None:
    # EPD "a" with a prefill pool "decode" and EPD "a-prefill" both wanted a-prefill-decode: the pool rule of
    # the CRD refuses such a pool; were it rendered, its suffix would carry a role token in a tail.
    assert any(t.split("-")[0] in ROLE_TOKENS for t in tails("prefill-decode-bundle"))
    assert {"master", "store", "encoder", "prefill", "decode", "pd", "proxy"} == ROLE_TOKENS
