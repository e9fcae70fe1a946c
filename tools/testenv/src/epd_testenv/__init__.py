"""Development-only test environment: the local Kubernetes control plane used by tests and `make demo`."""
