"""epd-operator: reconciles EPDDeployment resources into a matching E/P/D + Mooncake topology."""

__version__ = "0.1.0"
