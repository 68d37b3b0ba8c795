"""What ``fluffy doctor`` reports: one :class:`Check` per finding, gathered in a :class:`Report`.

Below both the machine checks (:mod:`fluffy.doctor`) and the kernel checks
(:mod:`fluffy.doctor_kernel`), which each make checks and never import one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from fluffy._version import __version__

Status = Literal["ok", "warn", "fail"]


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": self.status, "detail": self.detail}
        if self.fix:
            out["fix"] = self.fix
        if self.data:
            out["data"] = self.data
        return out


@dataclass
class Report:
    checks: list[Check]
    engine: dict[str, Any] | None

    @property
    def ok(self) -> bool:
        return all(check.status != "fail" for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "fluffy_version": __version__,
            "engine": self.engine,
            "checks": [check.as_dict() for check in self.checks],
        }
