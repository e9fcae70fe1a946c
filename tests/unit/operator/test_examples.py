"""Every example renders, and its whole rendering matches a committed golden file.

Regenerate the golden files after an intended change with `UPDATE_GOLDEN=1 pytest tests/unit/operator`, and
review the diff like code: it is exactly what the operator will apply.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from epd_connectors.config.bundle import parse_bundle
from epd_connectors.config.consistency import check_deployment
from epd_connectors.launch.plan import plan_launch
from epd_operator.api import constants as c
from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import Desired, render_desired

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GOLDEN = Path(__file__).resolve().parent / "golden"
UID = "00000000-0000-4000-8000-000000000001"
DEFAULTS = OperatorDefaults(prometheus_url="http://prometheus-operated.monitoring.svc:9090")
"""The chart's defaults with autoscaling.prometheusUrl set, as examples/e-pd-autoscaled.yaml asks."""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the bundles) as literal blocks, so a golden diff reads line by line."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_example(path: Path) -> Desired:
    doc = yaml.safe_load(path.read_text())
    meta = doc["metadata"]
    owner = Owner(name=meta["name"], namespace=meta.get("namespace", "default"), uid=UID)
    return render_desired(owner, parse_spec(doc["spec"]), DEFAULTS)


def golden_text(desired: Desired) -> str:
    return yaml.dump_all(desired.objects, Dumper=_Dumper, sort_keys=False, width=120, explicit_start=True)


def test_there_are_the_three_documented_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "e-pd-mooncake-cross-encoder.yaml",
        "e-p-d-store-offload.yaml",
        "e-pd-shared-storage.yaml",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_matches_its_golden_file(path: Path) -> None:
    actual = golden_text(render_example(path))
    golden = GOLDEN / f"{path.stem}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(actual)
    expected = golden.read_text() if golden.exists() else ""
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), actual.splitlines(keepends=True), str(golden), "rendered", n=2
            )
        )
        pytest.fail(f"{path.name} renders differently from {golden.name} (UPDATE_GOLDEN=1 to accept):\n{diff}")


def test_the_readmes_example_renders_consistent_bundles(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    manifest = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "readme.yaml").write_text(manifest)
    test_every_example_renders_consistent_bundles(tmp_path / "readme.yaml")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_renders_consistent_bundles(path: Path) -> None:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    assert (doc["apiVersion"], doc["kind"]) == (c.API_VERSION, c.KIND)
    desired = render_example(path)
    maps = [o for o in desired.objects if o["kind"] == "ConfigMap"]
    bundles = {
        m["metadata"]["name"]: parse_bundle(m["data"][c.BUNDLE_FILE], source=m["metadata"]["name"]) for m in maps
    }
    assert len(bundles) == len(desired.workloads)
    assert check_deployment(bundles) == []
    for obj in desired.objects:
        assert obj["metadata"]["namespace"] == doc["metadata"].get("namespace", "default")
        assert obj["metadata"]["ownerReferences"][0]["uid"] == UID


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_bundle_launches_in_its_pod(path: Path) -> None:
    """What epd-launch would do in each rendered pod: POD_IP replaces every placeholder, and every file it
    writes lands on the writable work volume (the root filesystem is read-only)."""
    desired = render_example(path)
    pod_ip = "10.1.2.3"
    for cm in (o for o in desired.objects if o["kind"] == "ConfigMap"):
        bundle = parse_bundle(cm["data"][c.BUNDLE_FILE])
        plan = plan_launch(
            bundle,
            workdir=c.WORK_DIR,
            bundle_path=f"{c.BUNDLE_MOUNT_DIR}/{c.BUNDLE_FILE}",
            environ={"POD_IP": pod_ip},
        )
        rendered = " ".join([*plan.argv, *plan.env.values(), *plan.files.values()])
        assert "pod-ip.invalid" not in rendered, cm["metadata"]["name"]
        assert all(f.startswith(c.WORK_DIR + "/") for f in plan.files), plan.files
        if bundle.store_client is not None:
            assert f"--host={pod_ip}" in plan.argv
        if bundle.vllm is not None:
            assert plan.env["VLLM_HOST_IP"] == pod_ip
            assert plan.env["PYTHONHASHSEED"] == str(desired.derived.python_hash_seed)
            assert plan.argv[plan.argv.index("--model") + 1].startswith(c.MODEL_MOUNT_DIR)
