"""Every spec the CRD admits either renders into children the API server accepts, or is refused naming a field.

Hypothesis builds hostile variants of an example (counts, quantities, names, labels, env, ports, sizes); each is
created through the real CRD on the test cluster's kube-apiserver (dryRun=All, so nothing is stored), rendered
with the operator's pure render, and every child is server-side applied with dryRun=All. The API server is the
judge: a child it refuses is a spec the CRD should not have admitted. No operator process runs here.
"""

from __future__ import annotations

import copy
import subprocess
import uuid
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from epd_operator.api.resource import InvalidSpecError, OperatorDefaults, Owner, parse_spec
from epd_operator.render import render_desired
from tests.cluster.operator_fixtures import EPD_PATH, REPO, ApiError, Kube

pytest_plugins = ["tests.cluster.operator_fixtures"]
pytestmark = pytest.mark.cluster

BASE: dict[str, Any] = yaml.safe_load((REPO / "examples" / "local-e-p-d.yaml").read_text())["spec"]
LIMIT_NAME = "n" * 39
"""The longest EPDDeployment name: '<name>-store-client' is a 52-character StatefulSet name."""


def _set(spec: dict[str, Any], path: str, value: Any) -> None:
    node = spec
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


_counts = st.one_of(st.integers(-2, 4), st.integers(0, 2**41), st.sampled_from([2**31 - 1, 2**31, 2**40, 4294967297]))
_quantities = st.one_of(
    st.sampled_from(["4 GB", "4GB", "4Gi", "500m", "1e3", "1.5", "-1", "", "0.5Gi", "1Ki", "12e", "+2", "3.", ".5"]),
    st.integers(-3, 2**70),
    st.from_regex(r"\A[0-9]{1,4}(Mi|Gi|m|k|M|)\Z"),
)
_resource_names = st.sampled_from(["cpu", "memory", "ephemeral-storage", "example.com/dev", "foo", "kubernetes.io/x"])
_resources = st.fixed_dictionaries(
    {},
    optional={
        "requests": st.dictionaries(_resource_names, _quantities, max_size=3),
        "limits": st.dictionaries(_resource_names, _quantities, max_size=3),
    },
)
_label_keys = st.sampled_from(["disk", "example.com/gpu", "a b", "x" * 64, "-bad", "ok.io/y_z", "a/b/c"])
_label_values = st.sampled_from(["ssd", "", "a b", "v" * 64, "-x", "A_1.b"])
_env_names = st.sampled_from(["OK_NAME", "A-B", "1X", "_x", "HAS SPACE", "Z9"])
_sizes = st.one_of(
    st.sampled_from(["2000PiB", "4 GiB", "0", "1", "64MiB", "1.5 GiB", "0.3 B", "9" * 30, "1PiB", "x"]),
    st.integers(-1, 2**62),
)
_pool_names = st.sampled_from(["tp2", "decode", "a-b", "x" * 16, "Tp", "main", "client", "p1"])
_names = st.sampled_from(["ok", LIMIT_NAME, "n" * 40, "a.b", "x" * 63, "Upper", "-a", "ends-"])
_ports = st.integers(-1, 70000)
_images = st.sampled_from(["epd/vllm:1", " epd/vllm:1", "a b", "", "registry.local/x@sha256:" + "0" * 64])

MUTATIONS: dict[str, st.SearchStrategy[Any]] = {
    "decode.replicas": _counts,
    "encoder.replicas": _counts,
    "proxy.replicas": _counts,
    "store.clients.replicas": _counts,
    "decode.maxSurge": _counts,
    "decode.tensorParallelSize": st.integers(0, 300),
    "decode.resources": _resources,
    "encoder.resources": _resources,
    "proxy.resources": _resources,
    "store.master.resources": _resources,
    "store.clients.resources": _resources,
    "decode.nodeSelector": st.dictionaries(_label_keys, _label_values, max_size=2),
    "decode.env": st.dictionaries(_env_names, st.text(max_size=5), max_size=2),
    "store.clients.segmentSize": _sizes,
    "store.localBufferSize": _sizes,
    "store.master.rpcPort": _ports,
    "proxy.service.port": _ports,
    "images.vllm": _images,
    "store.master.ha": st.fixed_dictionaries(
        {"etcdEndpoints": st.lists(st.sampled_from(["etcd:2379", "1.2.3.4:99999", "a b:1", "e-0.e:2"]), max_size=2)},
        optional={"replicas": _counts},
    ),
    "media.allowedDomains": st.lists(st.sampled_from(["*", "a.example.com", "10.0.0.9", "A.b", "x y", ""]), max_size=2),
    "media.allowedLocalMediaPath": st.sampled_from(["/media", "media", "/a/../b", "/", "//", "/m/"]),
    "prefill.additionalPools": st.lists(
        st.fixed_dictionaries({"name": _pool_names, "tensorParallelSize": st.integers(1, 2)}), max_size=2
    ),
}


@st.composite
def hostile(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    spec = copy.deepcopy(BASE)
    for path in draw(st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=3, unique=True)):
        _set(spec, path, draw(MUTATIONS[path]))
    return draw(_names), spec


def _with(path: str, value: Any, name: str = "ok") -> tuple[str, dict[str, Any]]:
    spec = copy.deepcopy(BASE)
    _set(spec, path, value)
    return name, spec


def _dry_run(kube: Kube, method: str, path: str, body: Any, content_type: str = "application/json") -> Any:
    sep = "&" if "?" in path else "?"
    return kube.request(method, f"{path}{sep}dryRun=All", body, content_type)


def _children_refused(kube: Kube, ns: str, name: str, spec: dict[str, Any]) -> list[str]:
    owner = Owner(name=name, namespace=ns, uid=str(uuid.uuid4()))
    desired = render_desired(owner, parse_spec(spec), OperatorDefaults())
    refused: list[str] = []
    for obj in desired.objects:
        group_version = obj["apiVersion"]
        base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        plural = {"NetworkPolicy": "networkpolicies"}.get(obj["kind"], obj["kind"].lower() + "s")
        path = f"{base}/namespaces/{ns}/{plural}/{obj['metadata']['name']}?fieldManager=epd-operator&force=true"
        try:
            _dry_run(kube, "PATCH", path, obj, "application/apply-patch+yaml")
        except ApiError as exc:
            refused.append(f"{obj['kind']} {obj['metadata']['name']}: {exc}")
    return refused


@pytest.fixture(scope="module")
def admission_ns(kube: Kube, crd: dict[str, Any]) -> Any:
    name = f"crd-admission-{uuid.uuid4().hex[:6]}"
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kube.delete(f"/api/v1/namespaces/{name}")


@settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=hostile())
@example(case=_with("decode.replicas", 2**40))
@example(case=_with("decode.replicas", 4294967297))
@example(case=_with("decode.resources", {"requests": {"memory": "4 GB"}}))
@example(case=_with("decode.replicas", 1, name="n" * 40))
@example(case=_with("decode.replicas", 1, name="a.b"))
@example(case=_with("decode.replicas", 1, name=LIMIT_NAME))
@example(case=_with("prefill.additionalPools", [{"name": "decode", "tensorParallelSize": 1}]))
@example(case=_with("store.master.ha", {"backend": "k8s"}))
@example(case=_with("proxy.resources", {"limits": {"cpu": "500m"}}))
@example(case=_with("media.allowedDomains", ["*", "a.example.com"]))
@example(case=_with("media.allowedLocalMediaPath", "//"))
def test_an_admitted_spec_renders_children_the_api_server_accepts(
    kube: Kube, admission_ns: str, case: tuple[str, dict[str, Any]]
) -> None:
    name, spec = case
    body = {"apiVersion": "epd.serving.io/v1alpha1", "kind": "EPDDeployment", "metadata": {"name": name}, "spec": spec}
    try:
        # fieldValidation=Strict, as kubectl sends: an unknown field is refused, not pruned.
        created = _dry_run(kube, "POST", EPD_PATH.format(ns=admission_ns) + "?fieldValidation=Strict", body)
    except ApiError as exc:
        assert exc.status in (400, 422), f"admission failed with {exc}"
        event("refused at admission")
        return  # refused at admission: the earliest point
    try:
        refused = _children_refused(kube, admission_ns, name, created["spec"])
    except InvalidSpecError as exc:
        assert all(p.startswith(("spec.", "metadata.name")) for p in exc.problems), exc.problems
        event("refused by render (Valid=False)")
        return
    event("rendered, every child accepted" if not refused else "rendered, a child refused")
    assert refused == [], f"admitted {name!r} {spec} but the API server refuses its children: {refused}"


def _kubectl_create(kubectl: Any, kubeconfig: Any, ns: str, name: str, spec: dict[str, Any]) -> Any:
    body = {"apiVersion": "epd.serving.io/v1alpha1", "kind": "EPDDeployment", "metadata": {"name": name}, "spec": spec}
    return subprocess.run(
        [str(kubectl), "--kubeconfig", str(kubeconfig), "-n", ns, "create", "--dry-run=server", "-f", "-"],
        input=yaml.safe_dump(body),
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize("name", ["n" * 40, "a.b"])
def test_a_name_no_child_can_carry_is_refused_at_apply_with_the_one_limit(
    kubectl: Any, kubeconfig: Any, admission_ns: str, name: str
) -> None:
    done = _kubectl_create(kubectl, kubeconfig, admission_ns, name, BASE)
    assert done.returncode != 0
    assert done.stderr.count("metadata.name: an EPDDeployment name is at most 39 characters") == 1, done.stderr


def test_a_name_at_the_limit_is_accepted_and_renders(
    kubectl: Any, kubeconfig: Any, kube: Kube, admission_ns: str
) -> None:
    done = _kubectl_create(kubectl, kubeconfig, admission_ns, LIMIT_NAME, BASE)
    assert done.returncode == 0, done.stderr
    assert _children_refused(kube, admission_ns, LIMIT_NAME, BASE) == []


def test_ha_masters_are_admitted_with_an_etcd_and_refused_with_a_metadata_server(
    kubectl: Any, kubeconfig: Any, kube: Kube, admission_ns: str
) -> None:
    spec = copy.deepcopy(BASE)
    _set(spec, "store.master.ha", {"replicas": 3, "etcdEndpoints": ["etcd-0.etcd:2379", "10.0.0.9:2379"]})
    done = _kubectl_create(kubectl, kubeconfig, admission_ns, "ha", spec)
    assert done.returncode == 0, done.stderr
    assert _children_refused(kube, admission_ns, "ha", spec) == []
    _set(spec, "store.master.httpMetadataServer", True)
    done = _kubectl_create(kubectl, kubeconfig, admission_ns, "ha", spec)
    assert done.returncode != 0 and "HA masters need httpMetadataServer false" in done.stderr, done.stderr
    _set(spec, "store.master", {"ha": {"etcdEndpoints": ["etcd:2379"]}, "snapshotIntervalSeconds": 60})
    done = _kubectl_create(kubectl, kubeconfig, admission_ns, "ha", spec)
    assert done.returncode != 0 and "replicate metadata instead of snapshotting" in done.stderr, done.stderr
    for ha in ({"backend": "k8s", "etcdEndpoints": ["etcd:2379"]}, {"replicas": 1, "etcdEndpoints": ["etcd:2379"]}):
        _set(spec, "store.master", {"ha": ha})
        done = _kubectl_create(kubectl, kubeconfig, admission_ns, "ha", spec)
        assert done.returncode != 0 and "spec.store.master.ha" in done.stderr, done.stderr
