"""Shared test configuration. Tier markers are declared in pyproject.toml; fixtures live beside their tier."""
