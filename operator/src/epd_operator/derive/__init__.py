"""Derived values: everything the operator computes from a spec rather than asks the user for.

Pure functions, no I/O. They exist so that values which must agree across roles (tenant, cache prefixes,
store TP, hash seed, addresses) are computed once, from one input, and can therefore never disagree.
Layering: derive imports only api and epd_connectors; render imports derive.
"""
