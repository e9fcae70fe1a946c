"""Fixtures of the cluster tier: a real local control plane, started once per session and only when needed.

The cluster lives in its own state folder (.run/test-cluster, or .run/test-cluster-N while another session
holds that one), apart from the developer's `make cluster-up` one, so they all run at once. Session fixtures
are created lazily, so a run that selects no test asking for the cluster never starts it. Each test gets its
own namespace, deleted afterwards.
"""

from __future__ import annotations

import pathlib
import re
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from epd_testenv import cluster, layout


@pytest.fixture(scope="session")
def test_cluster() -> Iterator[cluster.Cluster]:
    """The running test cluster; stopped at the end of the session (its logs stay in the state folder)."""
    # Fail, not skip, when the binaries are missing: a silently skipped tier looks like a passing one.
    for name in ("kube-apiserver", "kwok", "kubectl", "helm"):
        layout.binary(name)
    state_dir, claim = layout.claim_state_dir(layout.repo_root() / layout.TEST_CLUSTER_DIR)
    with claim:
        local = cluster.Cluster(state_dir)
        local.up()
        try:
            yield local
        finally:
            local.down()


@pytest.fixture(scope="session")
def kubeconfig(test_cluster: cluster.Cluster) -> pathlib.Path:
    """The admin kubeconfig of the test cluster (system:masters)."""
    return test_cluster.kubeconfig


@pytest.fixture(scope="session")
def api_client(kubeconfig: pathlib.Path) -> Iterator[client.ApiClient]:
    """A kubernetes ApiClient for the test cluster, not touching the process-wide default configuration."""
    configuration = client.Configuration()
    # The kubernetes client leaves these two untyped.
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    api = client.ApiClient(configuration)
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def namespace(api_client: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test; deleted afterwards (without waiting for the deletion)."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="session")
def kubectl() -> pathlib.Path:
    """The pinned kubectl (pass --kubeconfig, or KUBECONFIG in its environment)."""
    return layout.binary("kubectl")


@pytest.fixture(scope="session")
def helm() -> pathlib.Path:
    """The pinned helm client (pass --kubeconfig, or KUBECONFIG in its environment)."""
    return layout.binary("helm")
