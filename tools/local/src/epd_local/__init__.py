"""The local runner: an EPDDeployment on one machine, no cluster and no GPU (`epd-local`, or `python -m epd_local`).

It renders the deployment with the operator's own `render_desired`, on a loopback site (derive.site.LocalNetwork:
127.0.0.1 and a port per workload) instead of a cluster's, after the explicit CPU profile (`profile`) has adjusted
the spec; then it runs every role's rendered bundle through `epd-launch`, as a pod would. A tool beside the
operator (its own package): it uses the operator's pure core and nothing of its Kubernetes shell, and the operator
never imports it (import contracts in .importlinter).

- `profile`: the CPU-only adjustments, each one listed to the user.
- `plan`: YAML -> the instances to run (bundles, ports, readiness URLs); pure, unit-tested.
- `processes`: start, watch, log and stop the instances (process groups).
- `sample`: a sample request for the proxy (and its curl).
- `cli`: `run`, `plan`.
"""
