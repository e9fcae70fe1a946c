"""tests/images/pods.py without podman: a rendered pod template becomes the podman command a kubelet's container
would match (the security context, env, command and every volume), and what it cannot make is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from epd_local import plan as local_plan
from epd_operator.api.resource import OperatorDefaults
from epd_operator.derive.site import LocalNetwork, Paths, Site
from epd_operator.render import render_desired
from tests.images import pods

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


def rendered(example: str) -> dict[tuple[str, str], dict[str, Any]]:
    owner, spec = local_plan.load_manifest(REPO / "examples" / example)
    desired = render_desired(
        owner, spec, OperatorDefaults(), Site(network=LocalNetwork(base_port=40000), paths=Paths())
    )
    return {(o["kind"], o["metadata"]["name"]): o for o in desired.objects}


def test_a_vllm_pod_becomes_a_locked_down_container_with_its_volumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = rendered("local-e-pd.yaml")
    template = objects[("Deployment", "local-e-pd-pd")]["spec"]["template"]
    configmaps = {name: o for (kind, name), o in objects.items() if kind == "ConfigMap"}
    chowned: list[tuple[str, int, int]] = []
    monkeypatch.setattr(os, "chown", lambda path, uid, gid: chowned.append((Path(path).name, uid, gid)))
    volumes = pods.prepare(template, configmaps, tmp_path, {"model": tmp_path / "tiny"})
    argv = pods.podman_argv(template, "epd/pd:test", "pd-1", volumes)
    joined = " ".join(argv)
    assert argv[:2] == ["podman", "run"] and argv[-1] == "epd/pd:test"
    assert "--network host" in joined and "--user 10001:10001" in joined and "--read-only" in argv
    assert "--read-only-tmpfs=false" in argv and "--cap-drop=ALL" in argv and "no-new-privileges" in argv
    assert "--env POD_IP=127.0.0.1" in joined and "--env HOME=/var/run/epd" in joined
    assert json.loads(argv[argv.index("--entrypoint") + 1]) == ["epd-launch", "pd", "--bundle", "/etc/epd/bundle.json"]
    mounts = {target: (host, ro) for host, target, ro in volumes.binds}
    assert mounts["/etc/epd"] == (str(tmp_path / "bundle"), True)
    assert json.loads((tmp_path / "bundle" / "bundle.json").read_text())["role"] == "pd"
    assert mounts["/models"] == (str(tmp_path / "tiny"), True)
    assert mounts["/var/run/epd"] == (str(tmp_path / "work"), False) and mounts["/tmp"][0] == str(tmp_path / "tmp")
    assert ("work", 10001, 10001) in chowned and ("tmp", 10001, 10001) in chowned
    assert volumes.tmpfs == ["/dev/shm"]
    url = pods.readiness_url(template)
    assert url is not None and url.startswith("http://127.0.0.1:") and url.endswith("/health"), url


def test_what_it_cannot_make_is_refused(tmp_path: Path) -> None:
    template: dict[str, Any] = {
        "spec": {
            "containers": [{"name": "x", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}],
        }
    }
    with pytest.raises(pods.UntranslatableError, match="volume data"):
        pods.prepare(template, {}, tmp_path)
    template["spec"]["containers"][0] = {"name": "x", "env": [{"name": "N", "valueFrom": {"secretKeyRef": {}}}]}
    with pytest.raises(pods.UntranslatableError, match="env N"):
        pods.podman_argv(template, "i", "n", pods.Volumes())


@pytest.mark.parametrize("example", ["local-e-pd.yaml", "local-e-p-d.yaml"])
def test_on_a_loopback_site_every_probe_asks_the_port_its_bundle_binds(example: str) -> None:
    """The pod's declared ports are the site's, so a probe reaches the server the bundle starts."""
    objects = rendered(example)
    for (kind, name), obj in objects.items():
        if kind not in ("Deployment", "StatefulSet"):
            continue
        bundle = json.loads(objects[("ConfigMap", f"{name}-bundle")]["data"]["bundle.json"])
        url = pods.readiness_url(obj["spec"]["template"])
        if url is None:
            continue
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        section = next(bundle[k] for k in ("vllm", "proxy", "master") if bundle.get(k))
        bound = section.get("port", section.get("metrics_port"))
        assert port == bound, f"{name}: the probe asks {port}, the bundle binds {bound}"
