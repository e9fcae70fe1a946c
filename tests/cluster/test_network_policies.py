"""The rendered NetworkPolicies are accepted by the real API server as written, for every example and an
embedded-store variant (the one layout that gives vLLM pods a policy) and a variant admitting a scraper.

Only admission and schema are tested here: the test cluster's simulated nodes (and the real node's bridge CNI)
enforce no NetworkPolicy, so who can actually reach a port is asserted on the rendered objects in
tests/unit/operator/test_render.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import render_desired
from tests.cluster.test_control_plane import as_json

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_specs() -> list[tuple[str, dict[str, Any]]]:
    specs = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("kind") == "EPDDeployment" and doc["spec"].get("store"):
            specs.append((path.stem, doc["spec"]))
    embedded = next(spec for name, spec in specs if name == "e-p-d-store-offload")
    specs.append(("embedded", {**embedded, "store": {"mode": "embedded", "embeddedSegmentSize": "1GiB"}}))
    scraper = {"namespaceSelector": {"kubernetes.io/metadata.name": "monitoring"}, "podSelector": {"app": "prom"}}
    specs.append(("scraped", {**embedded, "store": {**embedded["store"], "metricsFrom": [scraper]}}))
    return specs


def test_every_rendered_network_policy_is_accepted_as_written(api_client: client.ApiClient, namespace: str) -> None:
    networking = client.NetworkingV1Api(api_client)
    seen_vllm_policy = False
    for name, spec in example_specs():
        owner = Owner(name=name, namespace=namespace, uid="00000000-0000-4000-8000-00000000000a")
        rendered = [o for o in render_desired(owner, parse_spec(spec), OperatorDefaults()).objects]
        policies = [o for o in rendered if o["kind"] == "NetworkPolicy"]
        assert policies, f"{name}: no NetworkPolicy rendered"
        for policy in policies:
            # No owner exists here, and the garbage collector would delete an object owned by a missing uid.
            body = {**policy, "metadata": {k: v for k, v in policy["metadata"].items() if k != "ownerReferences"}}
            created = networking.create_namespaced_network_policy(
                namespace, client.V1NetworkPolicy.model_validate(body)
            )
            back = as_json(created)["spec"]
            assert back == policy["spec"], f"{name}: {policy['metadata']['name']} changed on admission"
            role = policy["spec"]["podSelector"]["matchLabels"]["epd.serving.io/role"]
            seen_vllm_policy |= role not in ("master", "store-client")
    assert seen_vllm_policy, "the embedded variant rendered no policy for its segment-holding vLLM pods"
