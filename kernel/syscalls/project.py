"""``project.info``: what the kernel applies to this project (the first-run block).

It answers where the policy comes from (``.fluffy/policy.yaml`` or fluffy's defaults,
fitted to the layout the kernel detected at start), the layout itself, and the state of
the project's test environment (:mod:`fluffy.kernel.project.envstate`).  The CLI shows
it in one short block when a project has no ``.fluffy/`` yet, and in ``/status``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fluffy.ipc.results.admin import ProjectInfo
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import NoParams, Syscall, SyscallTable
from fluffy.kernel.project.layout import Layout

EnvStatus = Callable[[], dict[str, Any] | None]


def project_methods(
    project: Path | None,
    layout: Layout | None,
    default_policy: bool,
    environment: EnvStatus | None = None,
) -> SyscallTable:
    async def info(context: CallContext, params: NoParams) -> dict[str, Any]:
        has_config = project is not None and (project / ".fluffy").is_dir()
        env = await asyncio.to_thread(environment) if environment is not None else None
        return {
            "project": str(project) if project is not None else None,
            "layout": layout.to_dict() if layout is not None else None,
            "policy": {
                "source": "defaults" if default_policy else ".fluffy/policy.yaml",
                "default": default_policy,
            },
            "initialised": has_config,
            "environment": env,
        }

    return SyscallTable([Syscall("project.info", NoParams, info, ProjectInfo, since=1)])
