"""`python -m epd_operator.api > crds/epddeployments.yaml`: print the generated CRD (`make crds`)."""

from __future__ import annotations

import sys

import yaml

from epd_operator.api.crd import render_crd

HEADER = "# Generated from epd_operator.api by `make crds`; do not edit by hand.\n"


def crd_yaml() -> str:
    """The CRD file's exact content."""
    return HEADER + yaml.safe_dump(render_crd(), sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(crd_yaml())
