"""Which of containerd's images the real node's import removes (epd_testenv.nodeimages.stale_refs): every image
no wanted name points at, including the references the CRI plugin adds to an image it saw."""

from __future__ import annotations

import pytest

from epd_testenv import nodeimages

pytestmark = pytest.mark.unit

OLD, NEW, PAUSE, PROXY = "sha256:old", "sha256:new", "sha256:pause", "sha256:proxy"
# As `ctr images list` showed it on this machine after a vLLM rebuild was imported over the old one.
LISTED = [
    ("docker.io/epd/vllm:0.32.0-cpu", NEW),
    ("localhost/epd/vllm:0.32.0-cpu", NEW),
    ("sha256:fc7370e1", NEW),
    ("sha256:6fa56c70", OLD),
    ("localhost/epd/pause:1", PAUSE),
    ("sha256:9cbac65e", PAUSE),
    ("localhost/epd/proxy:0.1.0", PROXY),
]


def test_a_replaced_build_is_removed_with_the_cri_plugins_reference_to_it() -> None:
    wanted = ["localhost/epd/pause:1", "epd/vllm:0.32.0-cpu", "epd/proxy:0.1.0"]
    assert nodeimages.stale_refs(LISTED, wanted) == ["sha256:6fa56c70"]


def test_an_image_no_longer_wanted_goes_with_every_reference_to_it() -> None:
    wanted = ["localhost/epd/pause:1", "epd/proxy:0.1.0"]
    assert nodeimages.stale_refs(LISTED, wanted) == [
        "docker.io/epd/vllm:0.32.0-cpu",
        "localhost/epd/vllm:0.32.0-cpu",
        "sha256:6fa56c70",
        "sha256:fc7370e1",
    ]


def test_a_name_is_matched_whole_not_as_a_suffix_of_another() -> None:
    listed = [("localhost/epd/proxy:0.1.0", PROXY), ("localhost/other-epd/proxy:0.1.0", OLD)]
    assert nodeimages.stale_refs(listed, ["epd/proxy:0.1.0"]) == ["localhost/other-epd/proxy:0.1.0"]
