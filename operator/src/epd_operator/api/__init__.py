"""The EPDDeployment API: typed spec and status models, their defaults and rules, and the constants (group,
labels, annotations, condition types) every other layer uses. The CRD in crds/ is generated from here."""
