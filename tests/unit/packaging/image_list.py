"""images/images.txt as the packaging tests read it (one row per image folder, in build order), and the pin files
the images install."""

from __future__ import annotations

import pathlib

from epd_testenv import layout

REPO = pathlib.Path(__file__).resolve().parents[3]
IMAGES_TXT = REPO / "images" / "images.txt"
E2E_REQUIREMENTS = REPO / "hack" / "requirements-e2e.txt"
CONSTRAINTS = REPO / "images" / "constraints.txt"


def rows() -> list[list[str]]:
    """[folder, tag] or [folder, tag, cpu tag, gpu-0.34 tag], in build order."""
    return layout.image_rows()


def tags() -> dict[str, str]:
    """folder -> tag (the GPU, default flavour), in build order."""
    return {row[0]: row[1] for row in rows()}


def cpu_tags() -> dict[str, str]:
    """folder -> the CPU flavour's tag, for the images that have one."""
    return {row[0]: row[2] for row in rows() if len(row) == 4}


def gpu034_tags() -> dict[str, str]:
    """folder -> the gpu-0.34 flavour's tag (vLLM 0.34.0), for the images that have one."""
    return {row[0]: row[3] for row in rows() if len(row) == 4}


def pins(path: pathlib.Path) -> dict[str, str]:
    """name -> version of a requirements file of exact pins (`name==version` lines; comments skipped)."""
    lines = path.read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))
