"""Proxy HTTP tests: the proxy app served by its own server in the test's event loop, against stand-in backends."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "proxy" and item.path.parent.parent.name == "tests":
            item.add_marker(pytest.mark.proxy)
