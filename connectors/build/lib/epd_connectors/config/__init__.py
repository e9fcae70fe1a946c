"""Typed models of every runtime setting an E/P/D role needs, and the rules that keep them consistent.

Each model renders to the exact file, argv or JSON string its process takes. Every rule fails with a message
that names the field, the value and the fix (see `base.rule_error`).
"""
