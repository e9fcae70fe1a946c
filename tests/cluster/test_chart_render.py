"""The charts as helm renders them: lint, the CRD's one source, the RBAC rules, the operator's flags, peering.

These need only the pinned helm binary (no cluster) and take a fraction of a second each; they sit in the
cluster tier because that tier is where the binary is guaranteed (`make test-unit` needs no Go toolchain).
The rendered operator environment is parsed by the operator's own settings parser, so a chart value that the
operator would read differently fails here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import tarfile
from collections.abc import Sequence
from typing import Any

import pytest
import yaml

from epd_connectors.config.roles import Role
from epd_operator import settings as operator_settings
from epd_operator.api import constants as c
from epd_operator.api.resource import OperatorDefaults, Owner, parse_spec
from epd_operator.render import render_desired
from epd_testenv import layout

pytestmark = pytest.mark.cluster

REPO = layout.repo_root()
OPERATOR_CHART = REPO / "charts" / "epd-operator"
DEPLOYMENT_CHART = REPO / "charts" / "epd-deployment"
CRD_FILE = REPO / "crds" / "epddeployments.yaml"
NS = "epd-system"


def helm_run(args: Sequence[str], tmp: pathlib.Path, *, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp / "cache"),
        "HELM_CONFIG_HOME": str(tmp / "config"),
        "HELM_DATA_HOME": str(tmp / "data"),
    }
    done = subprocess.run(
        [str(layout.binary("helm")), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    if ok:
        assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def template(chart: pathlib.Path, tmp: pathlib.Path, *values: str, release: str = "epd") -> list[dict[str, Any]]:
    out = helm_run(["template", release, str(chart), "-n", NS, *values], tmp).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} found"
    return found[0]


def rules_of(doc: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, resourceName or '') of every rule, flattened."""
    flat: set[tuple[str, str, str, str]] = set()
    for rule in doc["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [""]:
                        flat.add((group, resource, verb, name))
    return flat


def flat(group: str, resources: Sequence[str], verbs: Sequence[str], name: str = "") -> set[tuple[str, str, str, str]]:
    return {(group, r, v, name) for r in resources for v in verbs}


WATCHED_RULES = (
    flat(c.GROUP, [c.PLURAL], ["get", "list", "watch", "patch"])
    | flat(c.GROUP, [f"{c.PLURAL}/status"], ["patch"])
    | flat(c.GROUP, [f"{c.PLURAL}/finalizers"], ["update"])
    | flat("apps", ["deployments", "statefulsets", "daemonsets"], ["list", "watch", "create", "patch", "delete"])
    | flat("", ["configmaps", "services"], ["list", "watch", "create", "patch", "delete"])
    | flat("networking.k8s.io", ["networkpolicies"], ["list", "watch", "create", "patch", "delete"])
    | flat("policy", ["poddisruptionbudgets"], ["list", "watch", "create", "patch", "delete"])
    | flat("autoscaling", ["horizontalpodautoscalers"], ["list", "watch", "create", "patch", "delete"])
    | flat("keda.sh", ["scaledobjects"], ["list", "watch", "create", "patch", "delete"])
    | flat("", ["serviceaccounts"], ["list", "watch", "create", "patch", "delete"])
    | flat("rbac.authorization.k8s.io", ["roles", "rolebindings"], ["list", "watch", "create", "patch", "delete"])
    | flat("discovery.k8s.io", ["endpointslices"], ["get", "list", "watch"])
    | flat("", ["pods"], ["list", "watch"])
    | flat("", ["pods/status"], ["patch"])
    | flat("", ["events"], ["create"])
)
"""What the operator needs where it serves EPDDeployments, and nothing else."""
CRD_WATCH = flat("apiextensions.k8s.io", ["customresourcedefinitions"], ["list", "watch"])


POD_FIELDS = {"metadata.namespace": NS, "metadata.name": "epd-epd-operator-0"}
"""What the kubelet gives the downward API's fieldRefs here."""


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    """The operator container's environment, as the kubelet fills it in."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    given = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    fields = {
        e["name"]: POD_FIELDS[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in container["env"] if "valueFrom" in e
    }
    return {**given, **fields}


# -- lint and the CRD


@pytest.mark.parametrize(
    "values",
    [
        (),
        ("--set", "replicaCount=3", "--set-json", 'watchNamespaces=["a","b"]', "--set", "serviceMonitor.enabled=true"),
        ("--set", "replicaCount=2", "--set", "peering.legacyGroup=true"),
    ],
    ids=["defaults", "namespaced-peering-monitor", "cluster-peering-legacy"],
)
def test_operator_chart_lints_strict(tmp_path: pathlib.Path, values: tuple[str, ...]) -> None:
    done = helm_run(["lint", "--strict", str(OPERATOR_CHART), *values], tmp_path)
    assert "0 chart(s) failed" in done.stdout


def test_deployment_chart_lints_strict(tmp_path: pathlib.Path) -> None:
    done = helm_run(["lint", "--strict", str(DEPLOYMENT_CHART)], tmp_path)
    assert "0 chart(s) failed" in done.stdout


def test_the_chart_crd_is_the_generated_one_also_when_packaged(tmp_path: pathlib.Path) -> None:
    """helm reads the symlink (show crds) and packages the file's content, so a packaged chart stands alone."""
    shown = [d for d in yaml.safe_load_all(helm_run(["show", "crds", str(OPERATOR_CHART)], tmp_path).stdout) if d]
    generated = yaml.safe_load(CRD_FILE.read_text())
    assert generated in shown
    helm_run(["package", str(OPERATOR_CHART), "-d", str(tmp_path)], tmp_path)
    with tarfile.open(tmp_path / "epd-operator-0.1.0.tgz") as archive:
        member = archive.getmember("epd-operator/crds/epddeployments.yaml")
        assert member.isfile(), "the package holds the CRD itself, not a link"
        extracted = archive.extractfile(member)
        assert extracted is not None
        assert extracted.read().decode() == CRD_FILE.read_text()


# -- RBAC


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses(tmp_path: pathlib.Path) -> None:
    docs = template(OPERATOR_CHART, tmp_path)
    main = one(docs, "ClusterRole", f"{NS}-epd-epd-operator")
    kopf = one(docs, "ClusterRole", f"{NS}-epd-epd-operator-kopf")
    assert rules_of(main) == WATCHED_RULES
    assert rules_of(kopf) == CRD_WATCH, "standalone and cluster-wide: kopf needs only the CRD watch"
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "epd-epd-operator", "namespace": NS}]


def test_namespaced_rbac_is_a_role_per_watched_namespace(tmp_path: pathlib.Path) -> None:
    docs = template(OPERATOR_CHART, tmp_path, "--set-json", 'watchNamespaces=["team-a","team-b"]')
    roles = [d for d in docs if d["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(rules_of(r) == WATCHED_RULES for r in roles)
    assert sorted(b["metadata"]["namespace"] for b in docs if b["kind"] == "RoleBinding") == ["team-a", "team-b"]
    kopf = one(docs, "ClusterRole")
    assert rules_of(kopf) == CRD_WATCH | flat("", ["namespaces"], ["list", "watch"])
    assert env_of(one(docs, "Deployment"))["EPD_OPERATOR_NAMESPACES"] == "team-a,team-b"


@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster-wide", "namespaced"])
def test_peering_with_more_than_one_replica(tmp_path: pathlib.Path, namespaced: bool) -> None:
    scope = ("--set-json", 'watchNamespaces=["team-a"]') if namespaced else ()
    docs = template(OPERATOR_CHART, tmp_path, "--set", "replicaCount=2", *scope)
    plural, kind = ("kopfpeerings", "KopfPeering") if namespaced else ("clusterkopfpeerings", "ClusterKopfPeering")
    peering = one(docs, kind, "epd-epd-operator")
    assert peering["apiVersion"] == "kopf.dev/v1"
    holder = one(docs, "Role") if namespaced else one(docs, "ClusterRole", f"{NS}-epd-epd-operator-kopf")
    expected = flat("kopf.dev", [plural], ["list", "watch"]) | flat("kopf.dev", [plural], ["patch"], "epd-epd-operator")
    assert expected <= rules_of(holder)
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    settings = operator_settings.parse([], env_of(deployment))
    assert settings.peering == "epd-epd-operator"
    pod_id = next(e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "POD_ID")
    assert pod_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_one_replica_is_standalone_and_never_overlaps(tmp_path: pathlib.Path) -> None:
    docs = template(OPERATOR_CHART, tmp_path)
    assert not [d for d in docs if d["apiVersion"].startswith("kopf.dev") or d["kind"] == "PodDisruptionBudget"]
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert operator_settings.parse([], env_of(deployment)).peering is None


def test_no_wildcards_in_any_rendering(tmp_path: pathlib.Path) -> None:
    for values in ((), ("--set", "replicaCount=2", "--set-json", 'watchNamespaces=["a"]')):
        for doc in template(OPERATOR_CHART, tmp_path, *values):
            for rule in doc.get("rules") or []:
                assert "*" not in [*rule["apiGroups"], *rule["resources"], *rule["verbs"]], rule


# -- the operator Deployment


def test_operator_deployment_is_hardened_and_probed(tmp_path: pathlib.Path) -> None:
    docs = template(OPERATOR_CHART, tmp_path)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["image"] == "epd/operator:0.1.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    settings = operator_settings.parse([], env_of(one(docs, "Deployment")))
    assert settings.liveness == f"http://0.0.0.0:{ports['health']}/healthz"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert settings.metrics_port == ports["metrics"]
    service = one(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert settings.all_namespaces and settings.namespaces == ()


def test_image_defaults_reach_the_operator(tmp_path: pathlib.Path) -> None:
    default = operator_settings.parse([], env_of(one(template(OPERATOR_CHART, tmp_path), "Deployment")))
    images = dataclasses.replace(default.defaults, operator_peer=None)
    assert images == OperatorDefaults(), "the chart's defaults are the operator's"
    docs = template(
        OPERATOR_CHART,
        tmp_path,
        "--set",
        "defaults.images.vllm=team/vllm-custom:0.33.0-1",
        "--set",
        "defaults.gpuResource=amd.com/gpu",
        "--set",
        "concurrentReconciles=9",
    )
    parsed = operator_settings.parse([], env_of(one(docs, "Deployment")))
    assert parsed.defaults.vllm_image == "team/vllm-custom:0.33.0-1"
    assert parsed.defaults.gpu_resource == "amd.com/gpu"
    assert parsed.concurrent_reconciles == 9


def test_the_operator_knows_its_pods_for_the_stores_policies_and_how_often_to_read_them(tmp_path: pathlib.Path) -> None:
    deployment = one(template(OPERATOR_CHART, tmp_path), "Deployment")
    settings = operator_settings.parse([], env_of(deployment))
    peer = settings.defaults.operator_peer
    assert peer is not None and peer.namespace == NS
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert dict(peer.labels) == deployment["spec"]["selector"]["matchLabels"]
    assert dict(peer.labels).items() <= pod_labels.items()
    assert settings.store_poll_interval_s == operator_settings.DEFAULT_STORE_POLL_INTERVAL_S
    off = one(template(OPERATOR_CHART, tmp_path, "--set", "storePollIntervalSeconds=0"), "Deployment")
    assert operator_settings.parse([], env_of(off)).store_poll_interval_s == 0
    assert settings.transfer_poll_interval_s == operator_settings.DEFAULT_TRANSFER_POLL_INTERVAL_S
    quiet = one(template(OPERATOR_CHART, tmp_path, "--set", "transferPollIntervalSeconds=0"), "Deployment")
    assert operator_settings.parse([], env_of(quiet)).transfer_poll_interval_s == 0


def test_service_monitor_is_optional(tmp_path: pathlib.Path) -> None:
    assert not [d for d in template(OPERATOR_CHART, tmp_path) if d["kind"] == "ServiceMonitor"]
    docs = template(OPERATOR_CHART, tmp_path, "--set", "serviceMonitor.enabled=true")
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (("--set-json", 'watchNamespaces=["team-*"]'), "/watchNamespaces/0"),
        (("--set", "replicas=2"), "additional properties 'replicas'"),
        (("--set", "replicaCount=-1"), "/replicaCount"),
        (("--set", "image.pullPolicy=Sometimes"), "/image/pullPolicy"),
    ],
    ids=["glob-namespace", "unknown-key", "negative-replicas", "pull-policy"],
)
def test_operator_schema_refuses(tmp_path: pathlib.Path, values: tuple[str, ...], complaint: str) -> None:
    done = helm_run(["template", "epd", str(OPERATOR_CHART), *values], tmp_path, ok=False)
    assert done.returncode != 0
    assert complaint in done.stderr


# -- the epd-deployment chart


def rendered_spec(tmp_path: pathlib.Path, *values: str) -> dict[str, Any]:
    doc = one(template(DEPLOYMENT_CHART, tmp_path, *values, release="my-model"), c.KIND)
    assert doc["apiVersion"] == c.API_VERSION
    assert doc["metadata"]["name"] == "my-model"
    spec: dict[str, Any] = doc["spec"]
    return spec


@pytest.mark.parametrize(
    "values",
    [
        (),
        ("--set", "store.protocol=tcp", "--set", "encoder.crossEncoderCache.enabled=true"),
        ("--set-json", 'prefill={"replicas": 2, "kv": {"connector": "mooncake"}}', "--set", "decode.replicas=2"),
    ],
    ids=["defaults", "store", "prefill-pool"],
)
def test_deployment_chart_renders_a_spec_the_operator_accepts(tmp_path: pathlib.Path, values: tuple[str, ...]) -> None:
    spec = rendered_spec(tmp_path, *values)
    desired = render_desired(Owner("my-model", NS, "uid"), parse_spec(spec), OperatorDefaults())
    roles = {w.role for w in desired.workloads}
    assert {Role.ENCODER, Role.PROXY} <= roles
    if "store.protocol=tcp" in values:
        assert {Role.MASTER, Role.STORE_CLIENT} <= roles
    if any("prefill=" in v for v in values):
        assert Role.PREFILL in roles


def test_deployment_chart_refuses_a_misspelt_value(tmp_path: pathlib.Path) -> None:
    done = helm_run(["template", "my-model", str(DEPLOYMENT_CHART), "--set", "decode.replica=2"], tmp_path, ok=False)
    assert "additional properties 'replica' not allowed" in done.stderr


def test_the_dashboard_is_a_sidecar_configmap_and_the_monitors_are_optional(tmp_path: pathlib.Path) -> None:
    docs = template(OPERATOR_CHART, tmp_path)
    dashboard = one(docs, "ConfigMap", "epd-epd-operator-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["epd-overview.json"])["panels"]
    assert panels and all(t["expr"] for p in panels for t in p["targets"])
    assert not [d for d in docs if d["kind"] in ("PodMonitor", "PrometheusRule")]
    on = template(OPERATOR_CHART, tmp_path, "--set", "podMonitor.enabled=true", "--set", "prometheusRule.enabled=true")
    monitor = one(on, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {c.LABEL_MANAGED_BY: c.MANAGED_BY}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} == {"http", "metrics"}
    assert one(on, "PrometheusRule")["spec"]["groups"][0]["rules"]
    off = template(OPERATOR_CHART, tmp_path, "--set", "grafanaDashboard.enabled=false")
    assert not [d for d in off if d["kind"] == "ConfigMap"]
