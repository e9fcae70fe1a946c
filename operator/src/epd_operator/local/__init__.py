"""The local runner: an EPDDeployment on one machine, no cluster and no GPU (`python -m epd_operator.local`).

It renders the deployment with the operator's own `render_desired`, on a loopback site (derive.site.LocalNetwork:
127.0.0.1 and a port per workload) instead of a cluster's, after the explicit CPU profile (`profile`) has adjusted
the spec; then it runs every role's rendered bundle through `epd-launch`, as a pod would. It sits beside the
operator's Kubernetes edge (apply), not inside it: the pure core never imports it.

- `profile`: the CPU-only adjustments, each one listed to the user.
- `plan`: YAML -> the instances to run (bundles, ports, readiness URLs); pure, unit-tested.
- `processes`: start, watch, log and stop the instances (process groups).
- `sample`: a sample request for the proxy (and its curl).
- `cli`: `run`, `plan`.
"""
