"""The bundles of a render, by workload name: what each role's pods read from their ConfigMap."""

from __future__ import annotations

from epd_connectors.config.bundle import RoleBundle, parse_bundle
from epd_operator.api import constants as c
from epd_operator.render import Desired


def bundles_of(desired: Desired) -> dict[str, RoleBundle]:
    return {
        o["metadata"]["name"].removesuffix("-bundle"): parse_bundle(o["data"][c.BUNDLE_FILE])
        for o in desired.objects
        if o["kind"] == "ConfigMap"
    }
