"""The root of fluffy's one error tree, and a walk over every class of it."""

from __future__ import annotations

from typing import Any, ClassVar


class FluffyError(Exception):
    """Base of every error fluffy raises on purpose.

    ``what`` is the one-line headline; ``why`` and ``fix`` default to the class-level
    text so a raise site only says what is specific to it.
    """

    code: ClassVar[str] = "fluffy.error"
    default_why: ClassVar[str] = ""
    default_fix: ClassVar[str] = ""
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        what: str,
        *,
        why: str | None = None,
        fix: str | None = None,
        context: str | None = None,
    ) -> None:
        super().__init__(what)
        self.what = what
        self.why = why if why is not None else self.default_why
        self.fix = fix if fix is not None else self.default_fix
        self.context = context

    def with_context(self, context: str) -> FluffyError:
        """Prefix ``what`` with the caller's context ("cannot build kernel: ...")."""
        self.what = f"{context}: {self.what}"
        self.args = (self.what,)
        return self

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "code": self.code,
            "what": self.what,
            "why": self.why,
            "fix": self.fix,
            "retryable": self.retryable,
        }
        if self.context:
            data["context"] = self.context
        return data


def all_error_classes() -> list[type[FluffyError]]:
    """Every class of the tree, base first (used by tests and docs)."""
    seen: list[type[FluffyError]] = []
    stack: list[type[FluffyError]] = [FluffyError]
    while stack:
        cls = stack.pop(0)
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    return seen
