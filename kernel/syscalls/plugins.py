"""``plugin.install`` on the kernel's IPC: a third-party plugin reviewed and audited.

The plugin store is the user's, on the host (``$FLUFFY_HOME/plugins``), shared by every
project; L1 mounts it read-only and the kernel is outside the host's trusted base
(ADR-033), so the kernel never writes it.  The kernel *decides and records*; the CLI
writes exactly the bytes that were decided on (ADR-040).  Two steps, like
``policy.update``:

1. **plan** (``approve`` absent): the files the CLI sent (:mod:`.wire`) are unpacked into
   a private folder of the kernel's state and read like any plugin folder (manifest,
   entry, imports: :func:`~.scan.discover`), checked against the built-ins' names and
   those of installed plugins, and their capabilities pre-checked against the kernel's
   *current* policy.  The answer is the plan (what ``fluffy plugin install`` shows) and
   its ``digest`` (:func:`~.wire.tree_digest`).  Nothing is recorded but the call.
2. **answer** (``approve: true | false`` with the plan's ``digest``): everything is checked
   again (the policy may have changed); an approval is taken only from the user's CLI
   socket (binding ``"cli"``) and where the policy does not deny ``plugin.install`` (the
   built-in rule asks for review).  It is recorded as ``plugin_install_approved``,
   durably, before the answer; the CLI installs after it.

Every refusal -- a caller that is not the CLI, the policy, files the store would not
copy, a manifest that does not validate, a name taken, a plan that changed, the user
saying no -- is recorded as ``plugin_install_refused`` and answered with the error's
stable code.  A malformed request is ``ipc.invalid_payload``; the kernel keeps serving.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import msgspec

from fluffy.errors import (
    InvalidPayload,
    PluginError,
    PluginInstallDenied,
    PluginInstallRefused,
    PluginNotConfirmed,
    PluginRejected,
)
from fluffy.ipc.results.admin import PluginInstalled
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.ipc.context import CallContext
from fluffy.kernel.ipc.syscalls import Syscall, SyscallTable
from fluffy.kernel.plugins.install import InstallPlan, read_home
from fluffy.kernel.plugins.precheck import precheck
from fluffy.kernel.plugins.scan import discover
from fluffy.kernel.plugins.store import MAX_FILES, PluginStore, write_tree
from fluffy.kernel.plugins.wire import decode_files, tree_digest
from fluffy.kernel.policy.audited import AuditedPolicy
from fluffy.kernel.policy.engine import Caller, Request
from fluffy.kernel.tools.sandbox.plugin_activation import Activated

RULE = "kernel.plugin_install"
REVIEW_DIR = "plugin-review"


class SentFile(msgspec.Struct, forbid_unknown_fields=True):
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
    data: str


class InstallParams(msgspec.Struct, forbid_unknown_fields=True):
    source: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    files: Annotated[list[SentFile], msgspec.Meta(max_length=MAX_FILES + 1)]
    approve: bool | None = None
    digest: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")] | None = None


def _as_source(error: PluginError, folder: Path, source: str) -> PluginError:
    """The error with the kernel's private review folder named as the user's folder."""
    here = str(folder)
    if here not in error.what and here not in (error.why or ""):
        return error
    return type(error)(
        error.what.replace(here, source), why=(error.why or "").replace(here, source), fix=error.fix
    )


def plugin_methods(
    front: AuditedPolicy,
    audit: AuditLog,
    state_dir: Path,
    plugins: Callable[[], Activated | None],
    store: PluginStore | None = None,
) -> SyscallTable:
    """``plugins``: the kernel's activated plugins (their registry knows the names taken)."""
    home = store or PluginStore.default()

    def review(files: dict[str, bytes], source: str) -> InstallPlan:
        """Unpack, read and check the sent plugin; pre-check it against the current policy."""
        (state_dir / REVIEW_DIR).mkdir(mode=0o700, exist_ok=True)
        folder = state_dir / REVIEW_DIR / uuid.uuid4().hex
        folder.mkdir(mode=0o700)
        try:
            write_tree(folder, files)
            found = discover(folder)
            if found.manifest is None:
                assert found.error is not None
                raise _as_source(found.error, folder, source)
            manifest = found.manifest
            activated = plugins()
            if activated is None or activated.registry is None:
                raise PluginRejected(
                    f"{manifest.name} cannot be reviewed: the kernel's plugin registry is not open",
                    why="the kernel could not open its plugin registry at start-up",
                    fix="See the kernel's log (`fluffy status`), then restart it.",
                )
            problem = activated.registry.refusal(manifest)
            if problem is None and manifest.name in read_home(home):
                problem = f"a plugin named {manifest.name!r} is already installed"
            if problem is not None:
                raise PluginRejected(
                    f"{manifest.name} {manifest.version} cannot be installed: {problem}",
                    why="the plugin's manifest or files do not meet fluffy's install rules",
                )
            warnings = precheck(front.engine.evaluate, manifest)  # the policy as it is now
            total = sum(len(data) for data in files.values())
            return InstallPlan(Path(source), manifest, len(files), total, warnings)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    async def record(
        event_type: str,
        context: CallContext,
        params: InstallParams,
        *,
        decision: str,
        rule: str | None,
        summary: str,
        reason: str | None = None,
        plan: dict[str, Any] | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        is_user = context.binding == "cli"
        metadata = {"source": params.source[:500], "binding": context.binding}
        metadata["peer_uid"] = str(context.peer.uid)
        if plan is not None:
            metadata.update(
                plugin=plan["name"],
                version=plan["version"],
                tools=",".join(t["name"] for t in plan["tools"]),
                capabilities=",".join(plan["required_capabilities"]),
                files=str(plan["files"]),
                warnings=str(len(plan["warnings"])),
            )
        metadata.update(extra or {})
        await audit.record(
            Event(
                event_type,
                caller="user" if is_user else f"plugin:{context.plugin_name}@{context.binding}",
                syscall_type="plugin.install",
                policy_decision=decision,
                policy_rule_name=rule,
                deny_reason=reason[:500] if reason else None,
                input_summary=summary,
                metadata=metadata,
            )
        )

    async def refuse(
        context: CallContext,
        params: InstallParams,
        error: PluginError,
        rule: str | None = RULE,
        plan: dict[str, Any] | None = None,
    ) -> PluginError:
        await record(
            "plugin_install_refused",
            context,
            params,
            decision="denied",
            rule=rule,
            summary=f"plugin install refused: {params.source}",
            reason=error.what,
            plan=plan,
            extra={"error_code": error.code},
        )
        return error

    async def install(context: CallContext, asked: InstallParams) -> dict[str, Any]:
        if asked.approve is not None and asked.digest is None:
            raise InvalidPayload("plugin.install: an answer (approve) names the plan's digest")
        if context.binding != "cli":
            raise await refuse(
                context,
                asked,
                PluginInstallDenied(
                    "plugins are installed only from the user's CLI",
                    why=f"this call came on the socket of {context.binding}, not the CLI's",
                ),
                rule=f"{RULE}.cli_only",
            )
        decision = front.evaluate(Request("plugin.install", Caller("user")))
        if decision.result == "deny":
            raise await refuse(
                context,
                asked,
                PluginInstallDenied(
                    f"the policy denies installing plugins ({'; '.join(decision.reasons)})",
                    why=f"rule {decision.decided_by} denies plugin.install",
                    fix="Change the rule in .fluffy/policy.yaml (`fluffy config policy edit`).",
                ),
                rule=decision.decided_by,
            )
        try:
            files = decode_files(asked.files)
            plan = await asyncio.to_thread(review, files, asked.source)
        except PluginError as error:
            raise await refuse(context, asked, error) from None
        shown = {**plan.to_dict(), "digest": tree_digest(files)}
        if asked.approve is None:
            return {"approved": False, "plan": shown}
        named = f"{plan.manifest.name} {plan.manifest.version}"
        if asked.digest != shown["digest"]:
            raise await refuse(
                context,
                asked,
                PluginInstallRefused(
                    f"{named} differs from the plan that was reviewed",
                    why="an answer names the digest of the files it approves",
                    fix="Install again and review the plan shown.",
                ),
                plan=shown,
            )
        if not asked.approve:
            raise await refuse(
                context,
                asked,
                PluginNotConfirmed(f"{named} was not installed: the user did not approve it"),
                rule="user",
                plan=shown,
            )
        await record(
            "plugin_install_approved",
            context,
            asked,
            decision="review_required",
            rule=decision.decided_by or "builtin:plugin-install",
            summary=f"plugin {named} approved for install by the user after review",
            plan=shown,
            extra={"digest": shown["digest"]},
        )
        return {"approved": True, "plan": shown}

    # callers: any -- a call from another socket is refused *and recorded* by the handler
    return SyscallTable(
        [Syscall("plugin.install", InstallParams, install, PluginInstalled, since=1)]
    )
