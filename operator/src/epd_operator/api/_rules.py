"""A spec rule written once, in both its forms: CEL for the API server (`kubectl apply` refuses at once) and a
Python predicate for the Valid condition and offline validation (examples, Helm values).

One row holds both, so the two forms of a rule cannot drift apart; a row without CEL is a rule the API server
cannot check (or must not: it needs render's derived values to explain itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeVar

from pydantic import ConfigDict, model_validator

from epd_connectors.config.base import problem
from epd_operator.api._base import ApiModel

M = TypeVar("M")


@dataclass(frozen=True)
class Rule(Generic[M]):
    """One rule: where it points, when it holds, and how to fix it."""

    field: str
    """The spec field the message names; one starting with "." is relative to wherever the model sits (a model used
    in several places), and `resource.parse_spec` puts the path in front."""
    holds: Callable[[M], bool]
    value: Callable[[M], object]
    """The offending value the message shows."""
    problem: str
    fix: str
    cel: str | None = None
    """The same predicate in CEL, or None for a rule only Python checks."""
    cel_message: str | None = None
    """The API server's message when it is not `<field>: <problem>; <fix>`."""

    def check(self, model: M) -> str | None:
        """The rule's message when `model` breaks it."""
        return None if self.holds(model) else problem(self.field, self.value(model), self.problem, self.fix)

    def cel_rule(self) -> dict[str, str]:
        assert self.cel is not None
        # The API server names the object's path itself before a message.
        field = self.field.removeprefix(".")
        return {"rule": self.cel, "message": self.cel_message or f"{field}: {self.problem}; {self.fix}"}


def broken(model: M, rules: tuple[Rule[M], ...]) -> list[str]:
    """The message of every rule `model` breaks, in table order."""
    return [message for rule in rules if (message := rule.check(model)) is not None]


def _attach_cel(schema: dict[str, Any], cls: type[Any]) -> None:
    found = [rule.cel_rule() for rule in getattr(cls, "RULES", ()) if rule.cel is not None]
    if found:
        schema["x-kubernetes-validations"] = found


class RuledModel(ApiModel):
    """An API model whose RULES are checked by the API server (their CEL) and by validation (their predicate)."""

    model_config = ConfigDict(json_schema_extra=_attach_cel)

    RULES: ClassVar[tuple[Rule[Any], ...]] = ()

    @model_validator(mode="after")
    def _rules_hold(self) -> Self:
        found = broken(self, type(self).RULES)
        if found:
            raise ValueError("; ".join(found))
        return self
