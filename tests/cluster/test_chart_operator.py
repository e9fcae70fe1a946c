"""The epd-operator chart against the local control plane: it installs, and its RBAC is enough and no more.

The proof of the RBAC runs the operator out of the cluster (a subprocess on loopback, as the other cluster
tests do) but authenticated as the chart's ServiceAccount, with a token from the TokenRequest API in a
kubeconfig of its own. That operator reconciles a sample EPDDeployment to Ready, logs no refused request (its
own or kopf's: namespaces, CRDs, peering, events), and the same identity is refused what the chart does not
grant. The chart's own operator pods are simulated by kwok, so they never act; only our subprocess does.

Everything here talks to the API server and to the operator's liveness and metrics endpoints on loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from epd_operator.api import constants as c
from epd_testenv import layout
from tests.cluster.operator_fixtures import (
    EPD_PATH,
    EXAMPLES,
    ApiError,
    Kube,
    Operator,
    claims,
    condition,
    eventually,
    example,
    provide_claim,
)

pytestmark = pytest.mark.cluster

CHART = layout.repo_root() / "charts" / "epd-operator"
SAMPLE = next(p for p in EXAMPLES if p.name == "e-pd-shared-storage.yaml")
RELEASE = "epd"
FULLNAME = f"{RELEASE}-epd-operator"
"""The chart's full name for this release (also its ServiceAccount, Deployment and peering name)."""
REFUSED = re.compile(r"\b403\b|Forbidden|forbidden|Not enough permissions")
"""What kopf or our client log when the API server refuses a request."""
LOG_STAMP = re.compile(r"^\[[^\]]*\]")
"""kopf's `[2026-12-06 05:03:40,403]` line prefix: its milliseconds can read 403."""


# -- helm and namespaces


def run_helm(env: Env, *args: str) -> str:
    """Run helm against the test cluster, with its cache and config in the test's folder (nothing in ~)."""
    home = env.tmp / "helm"
    variables = {
        **os.environ,
        "KUBECONFIG": str(env.kubeconfig),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    done = subprocess.run(
        [str(env.helm), *args], env=variables, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def make_namespace(kube: Kube, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def drop_namespace(kube: Kube, name: str) -> None:
    """Delete the EPDDeployments (their children follow), the pods at once (GPUs free), then the namespace."""
    kube.delete(EPD_PATH.format(ns=name))
    for plural in ("deployments", "statefulsets", "daemonsets", "replicasets"):
        kube.delete(f"/apis/apps/v1/namespaces/{name}/{plural}")
    with contextlib.suppress(ApiError):
        kube.request("DELETE", f"/api/v1/namespaces/{name}/pods", {"gracePeriodSeconds": 0})
    kube.delete(f"/api/v1/namespaces/{name}")
    eventually(f"the pods of {name} gone", lambda: kube.items(f"/api/v1/namespaces/{name}/pods") == [], every=0.2)
    for pv in kube.items(f"/api/v1/persistentvolumes?labelSelector=epd-op-test={name}"):
        kube.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")


# -- the chart's identity


def token_kubeconfig(
    kube: Kube, admin_kubeconfig: pathlib.Path, namespace: str, account: str, path: pathlib.Path
) -> None:
    """A kubeconfig for the ServiceAccount: the admin one's server and CA, a token from the TokenRequest API."""
    answer = kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    admin: dict[str, Any] = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(x for x in admin["contexts"] if x["name"] == admin["current-context"])["context"]
    cluster = next(x for x in admin["clusters"] if x["name"] == context["cluster"])["cluster"]
    for key in ("certificate-authority",):  # a relative file path would not resolve from our folder
        if key in cluster:
            cluster[key] = str((admin_kubeconfig.parent / cluster[key]).resolve())
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": answer["status"]["token"]}}],
        "contexts": [{"name": account, "context": {"cluster": "test", "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(doc))


class TokenKube(Kube):
    """Kube with a bearer token: call_api sends no credentials of its own (certificates live in the TLS context)."""

    def __init__(self, api: client.ApiClient, token: str) -> None:
        super().__init__(api)
        self.token = token

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        headers = {"Content-Type": content_type, "Accept": "application/json", "Authorization": f"Bearer {self.token}"}
        url = self.api.configuration.host + path
        response = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=30)
        raw = response.read()  # type: ignore[no-untyped-call]
        decoded = json.loads(raw) if raw else {}
        if response.status >= 300:
            raise ApiError(response.status, decoded)
        return decoded


@contextlib.contextmanager
def kube_as(kubeconfig: pathlib.Path) -> Iterator[Kube]:
    """Requests as the identity of a token kubeconfig (server and CA from it too)."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    api = client.ApiClient(configuration)
    token: str = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    try:
        yield TokenKube(api, token)
    finally:
        api.close()  # type: ignore[no-untyped-call]


class ChartOperator(Operator):
    """The operator subprocess with exactly the scope the chart was installed for (not the tests' glob)."""

    def __init__(self, kubeconfig: pathlib.Path, log: pathlib.Path, scope: tuple[str, ...]) -> None:
        super().__init__(kubeconfig, log, scope)

    def scope(self) -> list[str]:
        return []  # the chart's scope arrives in `extra` (--namespace ... or --all-namespaces)


def whoami(kube: Kube) -> str:
    """The user name the API server sees (SelfSubjectReview)."""
    review = kube.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    return str(review["status"]["userInfo"]["username"])


def posted_events(kube: Kube, namespace: str) -> list[str]:
    """Reasons of the Events the operator posted in `namespace`."""
    events = kube.items(f"/api/v1/namespaces/{namespace}/events")
    return [e["reason"] for e in events if (e.get("source") or {}).get("component") == c.MANAGED_BY]


def refusals(log: str) -> list[str]:
    return [line for line in log.splitlines() if REFUSED.search(LOG_STAMP.sub("", line, count=1))]


def test_a_log_line_stamped_at_403_milliseconds_is_no_refusal() -> None:
    stamped = "[2026-12-06 05:03:40,403] kopf.activities.auth [INFO    ] Activity 'login' succeeded."
    refused = "[2026-12-06 05:03:41,001] kopf.objects [ERROR   ] Request failed: (403) Forbidden"
    assert refusals(f"{stamped}\n{refused}") == [refused]


Access = tuple[str, str, str, str]
"""(verb, API group, resource, subresource)."""


def can(kube: Kube, access: Access, namespace: str | None = None) -> bool:
    """SelfSubjectAccessReview: may the caller do this?"""
    verb, group, resource, sub = access
    attributes: dict[str, Any] = {"verb": verb, "resource": resource, "group": group}
    if namespace:
        attributes["namespace"] = namespace
    if sub:
        attributes["subresource"] = sub
    review = kube.request(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        },
    )
    return bool(review["status"].get("allowed"))


GRANTED: tuple[Access, ...] = (
    # (verb, group, resource, subresource) the operator needs in a watched namespace
    *((v, c.GROUP, c.PLURAL, "") for v in ("get", "list", "watch", "patch")),
    ("patch", c.GROUP, c.PLURAL, "status"),
    ("update", c.GROUP, c.PLURAL, "finalizers"),
    *(
        (v, "apps", r, "")
        for r in ("deployments", "statefulsets", "daemonsets")
        for v in ("list", "watch", "create", "patch", "delete")
    ),
    # every other child kind too: watched, so that one deleted or changed by hand is repaired
    *((v, "", r, "") for r in ("configmaps", "services") for v in ("list", "watch", "create", "patch", "delete")),
    *((v, "networking.k8s.io", "networkpolicies", "") for v in ("list", "watch", "create", "patch", "delete")),
    *((v, "policy", "poddisruptionbudgets", "") for v in ("list", "watch", "create", "patch", "delete")),
    *((v, "autoscaling", "horizontalpodautoscalers", "") for v in ("list", "watch", "create", "patch", "delete")),
    *((v, "keda.sh", "scaledobjects", "") for v in ("list", "watch", "create", "patch", "delete")),
    *((v, "", "serviceaccounts", "") for v in ("list", "watch", "create", "patch", "delete")),
    *(
        (v, "rbac.authorization.k8s.io", r, "")
        for r in ("roles", "rolebindings")
        for v in ("list", "watch", "create", "patch", "delete")
    ),
    *((v, "discovery.k8s.io", "endpointslices", "") for v in ("get", "list", "watch")),
    # model pods: watched, and their revision-ready gate opened through the status subresource
    ("list", "", "pods", ""),
    ("watch", "", "pods", ""),
    ("patch", "", "pods", "status"),
    ("create", "", "events", ""),
)
DENIED: tuple[Access, ...] = (
    # requests the operator never makes: none may be allowed
    ("get", "", "secrets", ""),
    ("list", "", "secrets", ""),
    ("create", "", "pods", ""),
    ("delete", "", "pods", ""),
    ("patch", "", "pods", ""),
    ("update", "", "pods", "status"),
    ("create", c.GROUP, c.PLURAL, ""),
    ("delete", c.GROUP, c.PLURAL, ""),
    ("update", c.GROUP, c.PLURAL, ""),
    ("update", "apps", "deployments", ""),
    ("get", "apps", "deployments", ""),
    ("get", "", "configmaps", ""),
    ("watch", "", "secrets", ""),
    ("update", "", "configmaps", ""),
    ("update", "", "serviceaccounts", ""),
    ("create", "", "serviceaccounts", "token"),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
    ("escalate", "rbac.authorization.k8s.io", "roles", ""),
    ("bind", "rbac.authorization.k8s.io", "roles", ""),
    ("create", "discovery.k8s.io", "endpointslices", ""),
    ("create", "", "persistentvolumeclaims", ""),
    ("delete", "", "events", ""),
)


def check_grants(who: Kube, namespace: str, elsewhere: str | None) -> None:
    """Exactly GRANTED in `namespace`, nothing of DENIED; with `elsewhere`, nothing at all in that namespace."""
    missing = [g for g in GRANTED if not can(who, g, namespace)]
    assert missing == [], f"the chart does not grant {missing}"
    extra = [d for d in DENIED if can(who, d, namespace)]
    assert extra == [], f"the chart grants more than the operator uses: {extra}"
    if elsewhere is not None:
        leaked = [g for g in GRANTED if can(who, g, elsewhere)]
        assert leaked == [], f"a namespaced install grants outside its namespaces: {leaked}"
    for verb, resource in (("delete", "nodes"), ("list", "nodes"), ("list", "secrets"), ("create", "namespaces")):
        assert not can(who, (verb, "", resource, "")), f"the chart's account may {verb} {resource} cluster-wide"


def refused_directly(who: Kube, namespace: str) -> None:
    """Real requests, not reviews: the API server answers 403 to what the chart does not grant."""
    for method, path in (
        ("DELETE", "/api/v1/nodes/kwok-node-0"),
        ("GET", f"/api/v1/namespaces/{namespace}/secrets"),
        ("GET", "/api/v1/secrets"),
        ("POST", f"/api/v1/namespaces/{namespace}/pods"),
    ):
        with pytest.raises(ApiError) as refused:
            who.request(method, path, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}})
        assert refused.value.status == 403, f"{method} {path}: {refused.value}"


# -- fixtures


@dataclass
class Env:
    """What a chart test works with: the admin client, helm, and a scratch folder."""

    kube: Kube
    kubeconfig: pathlib.Path
    helm: pathlib.Path
    tmp: pathlib.Path

    def install(self, namespace: str, *values: str) -> None:
        run_helm(self, "install", RELEASE, str(CHART), "-n", namespace, "--wait", "--timeout", "90s", *values)

    def uninstall(self, namespace: str) -> None:
        run_helm(self, "uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "60s")

    def operator_kubeconfig(self, namespace: str) -> pathlib.Path:
        """A kubeconfig holding a token of the release's ServiceAccount."""
        path = self.tmp / "sa.kubeconfig"
        token_kubeconfig(self.kube, self.kubeconfig, namespace, FULLNAME, path)
        return path


@pytest.fixture
def env(api_client: client.ApiClient, kubeconfig: pathlib.Path, helm: pathlib.Path, tmp_path: pathlib.Path) -> Env:
    return Env(Kube(api_client), kubeconfig, helm, tmp_path)


@pytest.fixture
def system_namespace(env: Env) -> Iterator[str]:
    """Where the chart is installed."""
    name = make_namespace(env.kube, "epd-chart-system")
    try:
        yield name
    finally:
        drop_namespace(env.kube, name)


@pytest.fixture
def served_namespace(env: Env) -> Iterator[str]:
    """Where the sample EPDDeployment lives (not an epd-op-* namespace, which other modules' operators watch)."""
    name = make_namespace(env.kube, "epd-chart-served")
    try:
        yield name
    finally:
        drop_namespace(env.kube, name)


def crd_established(kube: Kube) -> bool:
    got = kube.find(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{c.PLURAL}.{c.GROUP}")
    return got is not None and condition(got, "Established").get("status") == "True"


def reconcile_sample(kube: Kube, namespace: str) -> dict[str, Any]:
    """Create the sample as a user would (admin) and wait until the operator reports it Ready."""
    doc = example(SAMPLE, namespace)
    for claim in claims(doc):
        provide_claim(kube, namespace, claim)
    eventually("the EPDDeployment API to answer", lambda: kube.find(EPD_PATH.format(ns=namespace)) is not None)
    kube.request("POST", EPD_PATH.format(ns=namespace), doc)
    name = doc["metadata"]["name"]

    def ready() -> dict[str, Any] | None:
        live = kube.epd(namespace, name)
        st = live.get("status") or {}
        if (
            st.get("observedGeneration") == live["metadata"]["generation"]
            and condition(live, c.COND_READY).get("status") == "True"
        ):
            return live
        return None

    def detail() -> str:
        st = kube.epd(namespace, name).get("status") or {}
        return "\n".join(f"{x['type']}={x['status']} {x['reason']}: {x['message']}" for x in st.get("conditions") or [])

    return eventually(f"{namespace}/{name} Ready", ready, detail=detail)


# -- tests


def test_namespaced_install_with_peering_reconciles_as_its_serviceaccount(
    env: Env, system_namespace: str, served_namespace: str
) -> None:
    kube = env.kube
    env.install(system_namespace, "--set-json", f'watchNamespaces=["{served_namespace}"]', "--set", "replicaCount=2")
    try:
        eventually("the CRD established", lambda: crd_established(kube))
        peering_path = f"/apis/kopf.dev/v1/namespaces/{served_namespace}/kopfpeerings/{FULLNAME}"
        assert kube.find(peering_path) is not None, "replicaCount=2 installs a KopfPeering in the watched namespace"
        sa_config = env.operator_kubeconfig(system_namespace)
        with kube_as(sa_config) as operator_identity:
            assert whoami(operator_identity) == f"system:serviceaccount:{system_namespace}:{FULLNAME}"
            check_grants(operator_identity, served_namespace, elsewhere=system_namespace)
            refused_directly(operator_identity, served_namespace)
        # Two replicas with the chart's same arguments (`main.peering_priority` says why that once paused both).
        scope = ("--namespace", served_namespace, "--peering", FULLNAME)
        replicas = [ChartOperator(sa_config, env.tmp / f"operator-{i}.log", scope) for i in range(2)]
        for replica in replicas:
            replica.start()
        try:
            eventually(
                "both replicas in the peering object", lambda: len(kube.get(peering_path).get("status") or {}) == 2
            )
            live = reconcile_sample(kube, served_namespace)
            assert live["status"]["phase"] == "Ready"
            changed = [r.metrics().get('epd_operator_reconciles_total{outcome="changed"}', 0) for r in replicas]
            assert sorted(x >= 1 for x in changed) == [False, True], f"exactly one replica handles: {changed}"
            assert "Applied" in posted_events(kube, served_namespace), "kopf posts the operator's Events"
        finally:
            for replica in replicas:
                replica.stop()
        for replica in replicas:
            log = replica.tail(lines=100000)
            assert refusals(log) == [], "the operator was refused requests:\n" + "\n".join(refusals(log))
    finally:
        env.uninstall(system_namespace)


def test_cluster_wide_install_reconciles_as_its_serviceaccount(
    env: Env, system_namespace: str, served_namespace: str
) -> None:
    kube = env.kube
    env.install(system_namespace)
    try:
        eventually("the CRD established", lambda: crd_established(kube))
        peerings = [p["metadata"]["name"] for p in kube.items("/apis/kopf.dev/v1/clusterkopfpeerings")]
        assert FULLNAME not in peerings, "one replica runs standalone: no peering object"
        sa_config = env.operator_kubeconfig(system_namespace)
        with kube_as(sa_config) as operator_identity:
            assert whoami(operator_identity) == f"system:serviceaccount:{system_namespace}:{FULLNAME}"
            check_grants(operator_identity, served_namespace, elsewhere=None)
            refused_directly(operator_identity, served_namespace)
        running = ChartOperator(sa_config, env.tmp / "operator.log", ("--all-namespaces",))
        running.start()
        try:
            reconcile_sample(kube, served_namespace)
        finally:
            running.stop()
        log = running.tail(lines=100000)
        assert refusals(log) == [], "the operator was refused requests:\n" + "\n".join(refusals(log))
    finally:
        env.uninstall(system_namespace)
    leftovers = [
        r["metadata"]["name"]
        for r in kube.items("/apis/rbac.authorization.k8s.io/v1/clusterroles")
        if r["metadata"]["name"].startswith(system_namespace)
    ]
    assert leftovers == [], "helm uninstall removes the cluster-scoped RBAC"


def test_without_the_charts_rbac_the_same_operator_is_refused(
    env: Env, system_namespace: str, served_namespace: str
) -> None:
    """The control for the two tests above: the same account without the chart's rules gets nowhere, and the
    operator's log says so (so an empty list of refusals there means something)."""
    env.install(system_namespace, "--set", "rbac.create=false")
    try:
        sa_config = env.operator_kubeconfig(system_namespace)
        with kube_as(sa_config) as operator_identity:
            assert not can(operator_identity, ("list", c.GROUP, c.PLURAL, ""), served_namespace)
        running = ChartOperator(sa_config, env.tmp / "operator.log", ("--namespace", served_namespace))
        running.start()
        try:
            eventually("a refused request in the operator's log", lambda: refusals(running.tail(lines=100000)))
        finally:
            running.stop()
    finally:
        env.uninstall(system_namespace)


def test_upgrade_as_the_install_guide_says(env: Env, system_namespace: str) -> None:
    """docs/install-gpu-cluster.md's upgrade: the CRDs applied from the chart (helm never upgrades crds/), then
    helm upgrade."""
    kube = env.kube
    env.install(system_namespace)
    try:
        crds = run_helm(env, "show", "crds", str(CHART))
        kubectl = [str(layout.binary("kubectl")), "--kubeconfig", str(env.kubeconfig)]
        applied = subprocess.run(
            [*kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-"],
            input=crds,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr
        assert f"customresourcedefinition.apiextensions.k8s.io/{c.PLURAL}.{c.GROUP} serverside-applied" in (
            applied.stdout
        )
        run_helm(env, "upgrade", RELEASE, str(CHART), "-n", system_namespace, "--reuse-values")
        run_helm(
            env, "upgrade", RELEASE, str(CHART), "-n", system_namespace, "--reuse-values", "--set", "replicaCount=2"
        )
        deployment = kube.get(f"/apis/apps/v1/namespaces/{system_namespace}/deployments/{FULLNAME}")
        assert deployment["spec"]["replicas"] == 2
        assert deployment["spec"]["strategy"]["type"] == "RollingUpdate", "peering replicas roll"
        assert kube.find(f"/apis/kopf.dev/v1/clusterkopfpeerings/{FULLNAME}") is not None
    finally:
        env.uninstall(system_namespace)
    assert kube.find(f"/apis/kopf.dev/v1/clusterkopfpeerings/{FULLNAME}") is None
