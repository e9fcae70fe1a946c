"""A package, so that its conftest's package-scoped fleet is stopped when the folder is done (in a plain
directory pytest treats package scope as session scope, and the fleet would outlive every later module)."""
