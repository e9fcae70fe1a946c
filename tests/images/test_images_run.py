"""The operator, proxy and Mooncake images run as the pods render makes would run them: non-root 10001, read-only
root filesystem, every capability dropped, the pod's volumes only (tests/images/pods.py); the versions inside
are the project's pins; nothing of the machine's package-index settings or CA bundle is in any layer."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from epd_connectors import store_probe
from tests.images import pods
from tests.images.conftest import REPO, pod, podman, render_for_containers, require_image
from tests.unit.packaging import image_list
from tests.unit.packaging.image_list import tags

pytestmark = pytest.mark.images

EXAMPLES = REPO / "examples"
CONSTRAINTS = image_list.pins(image_list.CONSTRAINTS)
VERSION_SCRIPT = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"


def versions(image: str, *names: str) -> dict[str, str]:
    """The installed versions of `names` inside `image`, as its own user sees them."""
    argv = ["run", "--rm", *pods.locked_down("none")]
    argv += ["--entrypoint", '["python", "-c"]', image, VERSION_SCRIPT, *names]
    found: dict[str, str] = json.loads(podman(*argv).stdout)
    return found


def test_the_operator_image_starts_its_command() -> None:
    image = require_image(tags()["operator"])
    argv = ["run", "--rm", *pods.locked_down("none")]
    result = podman(*argv, image, "--help", check=False)
    assert result.returncode == 0, result.stderr
    assert "usage: epd-operator" in result.stdout


def test_the_operator_image_has_no_kubernetes_client_library() -> None:
    """The operator talks to the API server with aiohttp and reads its kubeconfig itself (kubeconfig.py): the
    library's models, which kopf imports whenever the library is there, would be a third of its memory."""
    argv = ["run", "--rm", *pods.locked_down("none"), "--entrypoint", '["python", "-c"]']
    probe = "import importlib.util as u; print(u.find_spec('kubernetes') is None)"
    assert podman(*argv, require_image(tags()["operator"]), probe).stdout.strip() == "True"


@pytest.mark.parametrize(
    ("folder", "packages"),
    [
        ("operator", ("kopf", "aiohttp", "pydantic", "epd-operator", "epd-connectors")),
        ("proxy", ("httptools", "uvloop", "orjson", "prometheus-client", "epd-connectors")),
        ("mooncake", ("mooncake-transfer-engine-non-cuda", "epd-connectors")),
    ],
)
def test_the_versions_inside_are_the_pins(folder: str, packages: tuple[str, ...]) -> None:
    found = versions(require_image(tags()[folder]), *packages)
    project = tags()["operator"].rpartition(":")[2]
    for name in packages:
        want = project if name.startswith("epd-") else CONSTRAINTS[name]
        assert found[name] == want, f"{folder}: {name} {found[name]}, pinned {want}"


@pytest.mark.parametrize("binary", ["mooncake_master", "mooncake_client", "store.so", "engine.so"])
def test_every_library_the_mooncake_binaries_link_is_in_the_image(binary: str) -> None:
    """ldd in the image itself (the machine has libraries an image may lack: libcurl was one)."""
    argv = ["run", "--rm", *pods.locked_down("none")]
    script = f"ldd /usr/local/lib/python3.11/site-packages/mooncake/{binary}"
    result = podman(*argv, "--entrypoint", '["sh", "-c"]', require_image(tags()["mooncake"]), script, check=False)
    assert result.returncode == 0 and "=>" in result.stdout, result.stderr
    assert "not found" not in result.stdout, result.stdout


def test_the_proxy_image_serves_health_from_its_rendered_bundle(tmp_path: Path) -> None:
    """No backend answers (none runs), so /health is 503 and names the roles it waits for."""
    rendered = render_for_containers(EXAMPLES / "local-e-pd.yaml")
    with pod(rendered, "local-e-pd-proxy", tags()["proxy"], tmp_path) as proxy:
        assert proxy.wait_ready(ok=(503,)) == 503
        assert proxy.ready_url is not None
        try:
            urllib.request.urlopen(proxy.ready_url, timeout=5)
        except urllib.error.HTTPError as exc:
            body = exc.read().decode()
        assert "encoder" in body and "pd" in body, body


def test_the_mooncake_image_runs_the_master_and_a_store_client_that_mounts_its_segment(tmp_path: Path) -> None:
    rendered = render_for_containers(EXAMPLES / "local-e-p-d.yaml")
    image = tags()["mooncake"]
    with pod(rendered, "local-e-p-d-master", image, tmp_path) as master:
        master.wait_ready()
        assert master.ready_url is not None
        metrics_url = master.ready_url.rsplit("/", 1)[0] + "/metrics"
        with pod(rendered, "local-e-p-d-store-client", image, tmp_path):
            deadline = time.monotonic() + 120
            capacity = 0
            while time.monotonic() < deadline and not capacity:
                with urllib.request.urlopen(metrics_url, timeout=5) as response:
                    capacity = store_probe.capacity_from_metrics(response.read().decode()) or 0
                time.sleep(0.5)
            assert capacity > 0, f"no segment mounted:\n{master.logs()}"


def machine_settings() -> list[Path]:
    """The files images/build.sh lends to the RUN steps that are the machine's own (no Debian package of the
    host ships them: its package-index settings), and its CA bundle."""
    roots = ["/etc/pip.conf", "/etc/apt/sources.list", "/etc/apt/sources.list.d", "/etc/apt/apt.conf.d"]
    files: list[Path] = []
    for root in map(Path, roots):
        files += (
            sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root] if root.is_file() else []
        )
    own = [p for p in files if subprocess.run(["dpkg", "-S", str(p)], capture_output=True, check=False).returncode]
    return [*own, Path("/etc/ssl/certs/ca-certificates.crt")]


def assert_no_layer_holds_the_machines_settings(image: str) -> list[Path]:
    """Every layer of the image, as containers-storage keeps it on disk: none holds one of the machine's own
    settings with the machine's content (Debian's public sources and the image's own CA bundle are fine)."""
    data = json.loads(podman("image", "inspect", "--format", "{{json .GraphDriver.Data}}", image).stdout)
    layers = [Path(p) for p in data.get("LowerDir", "").split(":") if p] + [Path(data["UpperDir"])]
    assert len(layers) >= 2 and all(layer.is_dir() for layer in layers), data
    settings = [p for p in machine_settings() if p.is_file() and p.stat().st_size]
    assert any(p.name == "ca-certificates.crt" for p in settings)
    for layer in layers:
        for path in settings:
            copy = layer / path.relative_to("/")
            assert not (copy.is_file() and copy.read_bytes() == path.read_bytes()), f"{copy} is the machine's {path}"
    return layers


@pytest.mark.parametrize("folder", ["operator", "proxy", "mooncake"])
def test_no_layer_holds_the_machines_package_settings_or_ca_bundle(folder: str) -> None:
    assert_no_layer_holds_the_machines_settings(require_image(tags()[folder]))
