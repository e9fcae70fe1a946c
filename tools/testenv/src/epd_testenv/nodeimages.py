"""Images for the real node: the pod sandbox image made here, and the project's images copied from the build's
storage (buildah/podman, images/build.sh) into containerd, where the kubelet finds them; nothing is pulled.

A copy is `buildah push IMAGE docker-archive:-` streamed into `ctr images import`. containerd's root is a cache
shared by clusters (realnode.NodeFiles), so an image is copied again only when its id changed: a file there
records the id each name was imported from. Every other image there is removed, so a rebuild's GBs do not pile up.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable

from epd_testenv import layout, process, realnode, timeline

IMPORTED_FILE = "epd-imported.json"
IMPORT_TIMEOUT_S = 1800.0
"""A multi-GB vLLM image takes minutes on a loaded 2-core machine."""


class ImageError(Exception):
    """An image is missing from the build's storage, or containerd refused it."""


def containerd_answers(files: realnode.NodeFiles) -> bool:
    """containerd serves its API on the node's socket."""
    if not files.containerd_socket.exists():
        return False
    result = subprocess.run([*files.ctr, "version"], capture_output=True, timeout=10, check=False)
    return result.returncode == 0


def pause_archive(binary: pathlib.Path, name: str = realnode.PAUSE_IMAGE) -> bytes:
    """A docker-archive holding one layer with /pause (tools/k8s/pause), its entrypoint."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = binary.read_bytes()
        info = tarfile.TarInfo("pause")
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
    layer_bytes = layer.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"]},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        }
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [name], "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for member, payload in (
            (f"{diff_id}/layer.tar", layer_bytes),
            (config_name, config),
            ("manifest.json", manifest),
        ):
            info = tarfile.TarInfo(member)
            info.size, info.mtime = len(payload), 0
            tar.addfile(info, io.BytesIO(payload))
    return archive.getvalue()


def _built_id(tag: str) -> str:
    """The id of a tag in the build's storage (images/build.sh commits to localhost/<tag>)."""
    result = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", f"localhost/{tag}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ImageError(f"image {tag} is not built here: run `make images-test` (or `make images-test-vllm`)")
    return result.stdout.strip()


def _imported(files: realnode.NodeFiles) -> dict[str, str]:
    path = files.containerd_root / IMPORTED_FILE
    try:
        loaded: dict[str, str] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return loaded


def _record(files: realnode.NodeFiles, imported: dict[str, str]) -> None:
    path = files.containerd_root / IMPORTED_FILE
    path.write_text(json.dumps(imported, indent=2, sort_keys=True) + "\n")


def _names_in_containerd(files: realnode.NodeFiles) -> set[str]:
    listed = subprocess.run([*files.ctr, "images", "list", "--quiet"], capture_output=True, text=True, check=False)
    return set(listed.stdout.split())


def _present(tag: str, names: set[str]) -> bool:
    """containerd names a short tag with its registry host in front; ours are all short."""
    return any(name == tag or name.endswith(f"/{tag}") for name in names)


def stale_refs(listed: Iterable[tuple[str, str]], wanted: Iterable[str]) -> list[str]:
    """The image references of `listed` ((ref, target digest) pairs) whose target no wanted name has.

    The CRI plugin adds its own references to an image it saw (docker.io/<tag>, and sha256:<image id>), so
    removing our names alone leaves a replaced build alive."""
    pairs = list(listed)
    names = set(wanted)
    kept = {digest for ref, digest in pairs if any(_present(name, {ref}) for name in names)}
    return sorted(ref for ref, digest in pairs if digest not in kept)


def _listed(files: realnode.NodeFiles) -> list[tuple[str, str]]:
    """(ref, target digest) of every image in containerd's namespace."""
    listed = subprocess.run([*files.ctr, "images", "list"], capture_output=True, text=True, check=False)
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    return [(row[0], row[2]) for row in rows if len(row) >= 3]


def _remove(files: realnode.NodeFiles, refs: list[str]) -> None:
    """Removed, the last synchronously: containerd's GC then frees their layers before anything is copied."""
    for index, ref in enumerate(refs):
        sync = ["--sync"] if index == len(refs) - 1 else []
        subprocess.run([*files.ctr, "images", "rm", *sync, ref], capture_output=True, check=False)


def import_images(files: realnode.NodeFiles, tags: Iterable[str], say: Callable[[str], None]) -> None:
    """The pause image and each tag, in containerd, imported when missing or rebuilt since; other images go."""
    tags = list(tags)
    imported = _imported(files)
    present = _names_in_containerd(files)
    pause_id = hashlib.sha256(layout.binary("pause").read_bytes()).hexdigest()
    if imported.get(realnode.PAUSE_IMAGE) != pause_id or realnode.PAUSE_IMAGE not in present:
        _ctr_import(files, pause_archive(layout.binary("pause")), realnode.PAUSE_IMAGE)
        imported[realnode.PAUSE_IMAGE] = pause_id
        _record(files, imported)
    for tag in tags:
        built = _built_id(tag)
        if imported.get(tag) == built and _present(tag, present):
            continue
        say(f"cluster: copying image {tag} into the real node's containerd (once per build) ...")
        began = time.monotonic()
        # The old build goes first: the disk then never holds two copies of a vLLM image.
        _remove(files, stale_refs(_listed(files), (t for t in [realnode.PAUSE_IMAGE, *tags] if t != tag)))
        with timeline.stage(f"image {tag} into containerd"):
            _push_into_containerd(files, tag)
        imported[tag] = built
        _record(files, imported)
        say(f"cluster:   ok ({time.monotonic() - began:.0f} s)")
    _remove(files, stale_refs(_listed(files), [realnode.PAUSE_IMAGE, *tags]))


def _ctr_import(files: realnode.NodeFiles, archive: bytes, name: str) -> None:
    result = subprocess.run([*files.ctr, "images", "import", "-"], input=archive, capture_output=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"ctr images import {name}: {result.stderr.decode(errors='replace').strip()}")


def _push_into_containerd(files: realnode.NodeFiles, tag: str) -> None:
    push = subprocess.Popen(
        ["buildah", "push", "--quiet", f"localhost/{tag}", f"docker-archive:/dev/stdout:{tag}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert push.stdout is not None
    imported = subprocess.run(
        [*files.ctr, "images", "import", "-"],
        stdin=push.stdout,
        capture_output=True,
        timeout=IMPORT_TIMEOUT_S,
        check=False,
    )
    push.stdout.close()
    _, push_err = push.communicate(timeout=IMPORT_TIMEOUT_S)
    if push.returncode != 0:
        raise ImageError(f"buildah push {tag}: {push_err.decode(errors='replace').strip()}")
    if imported.returncode != 0:
        raise ImageError(f"ctr images import {tag}: {imported.stderr.decode(errors='replace').strip()}")


def preload(state_dir: pathlib.Path, tags: Iterable[str], say: Callable[[str], None], timeout_s: float = 60) -> None:
    """What a real node's start copies, copied beforehand by a containerd of its own on the shared root, then
    stopped: `make test` runs this beside the tiers that need no node, so the real-pod tier finds them current.
    Touches nothing on the machine but that root and `state_dir` (no bridge, rule or sysctl)."""
    files = realnode.NodeFiles(state_dir.resolve(), layout.containerd_root())
    files.dir.mkdir(parents=True, exist_ok=True)
    files.containerd_root.mkdir(parents=True, exist_ok=True)
    files.containerd_config.write_text(realnode.containerd_config(files))
    containerd = realnode.containerd(files)
    binary = shutil.which(containerd.binary or "containerd")
    if binary is None:
        raise ImageError("containerd is not installed: run `make setup` (installs it)")
    running = process.start(containerd.name, [binary, *containerd.argv], files.dir / "logs")
    try:
        deadline = time.monotonic() + timeout_s
        while not containerd_answers(files):
            if time.monotonic() > deadline or not process.is_ours(running.pid, files.state):
                raise ImageError(f"containerd did not answer; log {running.log}:\n{process.log_tail(running.log)}")
            time.sleep(0.2)
        import_images(files, tags, say)
    finally:
        process.stop([running], files.state)
