"""Shared test configuration. Tier markers are declared in pyproject.toml; fixtures live beside their tier."""

from hypothesis import settings

# Property tests check what a value is, never how fast it is computed (speed lives in bench/): without a
# deadline an example that runs slowly on a busy 2-core CI machine is not reported as a flaky failure.
settings.register_profile("epd", deadline=None)
settings.load_profile("epd")
