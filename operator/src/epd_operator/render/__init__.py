"""Render: pure functions from a spec to complete desired objects (owner references and labels included).

The public surface is `render_desired` and its result types; the reconciler applies `Desired.objects` in order
and reports `Desired.derived` and `Desired.workloads` in status.
"""

from epd_operator.render.desired import Derived, Desired, RoleWorkload, render_desired

__all__ = ["Derived", "Desired", "RoleWorkload", "render_desired"]
