"""The operator image reconciles for real: epd-operator in a podman container of the built image (user 10001,
read-only root filesystem, every capability dropped), with only a kubeconfig of the test cluster mounted, on the
host network so it reaches the API server on loopback. An example gets every child the operator's own render
names and becomes Ready, as with the operator run from the checkout (test_operator_lifecycle.py)."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from epd_operator.render.pod import RUN_AS_USER
from tests.cluster.operator_fixtures import EXAMPLES, Kube, Operator, eventually, example, key
from tests.cluster.test_operator_lifecycle import create, ready, rendered
from tests.images import pods
from tests.images.conftest import podman, require_image
from tests.unit.packaging.image_list import tags

pytestmark = [pytest.mark.cluster, pytest.mark.images]
pytest_plugins = ["tests.cluster.operator_fixtures"]

KUBECONFIG_IN_CONTAINER = "/etc/epd-operator/kubeconfig"


class ContainerOperator(Operator):
    """The same operator, its argv run by `podman run` in the image instead of by this checkout's Python."""

    def __init__(self, kubeconfig: pathlib.Path, log: pathlib.Path, image: str, name: str) -> None:
        super().__init__(kubeconfig, log)
        self.image, self.name = image, name
        self.scratch = log.with_name("tmp")
        self.scratch.mkdir(exist_ok=True)
        os.chown(self.scratch, RUN_AS_USER, RUN_AS_USER)

    def argv(self) -> list[str]:
        own = super().argv()
        arguments = own[own.index("epd_operator.main") + 1 :]
        arguments[arguments.index(str(self.kubeconfig))] = KUBECONFIG_IN_CONTAINER
        run = ["podman", "run", "--rm", "--name", self.name, *pods.locked_down("host")]
        # The chart's Deployment: a /tmp emptyDir, and here the kubeconfig instead of a ServiceAccount token.
        run += ["--volume", f"{self.scratch}:/tmp:rw", "--volume", f"{self.kubeconfig}:{KUBECONFIG_IN_CONTAINER}:ro"]
        return [*run, self.image, *arguments]

    def stop(self) -> None:
        super().stop()  # SIGTERM to `podman run`, which hands it to the container
        podman("rm", "--force", "--time", "5", self.name, check=False)


@pytest.fixture(scope="module")
def operator(
    crd: dict[str, Any], kubeconfig: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    image = require_image(tags()["operator"])
    readable = tmp_path_factory.mktemp("operator-image") / "kubeconfig"
    readable.write_bytes(kubeconfig.read_bytes())
    readable.chmod(0o644)  # the container's user reads it, not its owner
    running = ContainerOperator(readable, readable.with_name("operator.log"), image, "epd-test-operator")
    running.start(timeout=90)
    try:
        yield running
    finally:
        running.stop()


def test_the_operator_image_reconciles_an_example_to_ready(operator: Operator, kube: Kube, op_namespace: str) -> None:
    path = next(p for p in EXAMPLES if p.name == "e-pd-shared-storage.yaml")
    doc = example(path, op_namespace)
    name = doc["metadata"]["name"]
    create(kube, doc)
    wanted = {key(o) for o in rendered(kube, op_namespace, name).objects}
    eventually("every child", lambda: wanted <= {key(o) for o in kube.children(op_namespace, name)}, timeout=120)
    assert ready(kube, op_namespace, name)["status"]["phase"] == "Ready"
    running = podman("inspect", "--format", "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}", "epd-test-operator")
    assert running.stdout.split() == [f"{RUN_AS_USER}:{RUN_AS_USER}", "true"], running.stdout
