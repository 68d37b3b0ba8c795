"""The tool router: policy check → route → execute → sanitise → audit → return.

Every AI tool call takes this path (design: AI Tools Module).  The answer is always a
result object — a refusal or a failure is a result the AI reads, never a broken
connection: ``{"ok": false, "error": {...}}`` with the error's code, what / why / fix,
``retryable``, and for a tool the workflow does not allow now the design's
ToolUnavailableError fields.

Routing: read-only tools run kernel-native (the fast path); writes, test runs and git
run in a fresh L2 sandbox of their plugin (:mod:`fluffy.kernel.tools.plugins`), whose
output is validated and *staged*; only the merge in ``reviewing`` writes the project.
Reads are retried once after 100 ms; writes never (their errors say whether a retry
makes sense).  Each call leaves a ``tool_execute`` and a ``tool_result`` audit entry
(the latter with the sanitised output and the original's size and hash).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from fluffy.errors import (
    EngineUnavailable,
    FluffyError,
    KernelOverloaded,
    MergeConflict,
    MergeRefused,
    PolicyError,
    ToolFailed,
    ToolInputInvalid,
    ToolNotFound,
    ToolRefused,
    ToolUnavailable,
)
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.observer import summarize
from fluffy.kernel.mcp.servers import McpServers
from fluffy.kernel.merge.ingest import ingest
from fluffy.kernel.merge.merger import Merger
from fluffy.kernel.merge.paths import read_regular, safe_relpath
from fluffy.kernel.policy.audited import AuditedPolicy, request_data
from fluffy.kernel.policy.engine import Caller, Request
from fluffy.kernel.policy.tokens import TokenUse
from fluffy.kernel.policy.tool_settings import ToolSettings
from fluffy.kernel.scheduler.scheduler import Scheduler
from fluffy.kernel.scheduler.task import PRIORITY_HIGH, PRIORITY_NORMAL
from fluffy.kernel.tools import availability
from fluffy.kernel.tools.breaker import BreakerBoard, counts_as_failure
from fluffy.kernel.tools.capabilities import Scope, token_ref
from fluffy.kernel.tools.fastpath import FastPath, parse_args
from fluffy.kernel.tools.flow import Flow
from fluffy.kernel.tools.parallel import PlannedCall
from fluffy.kernel.tools.pluginjob import PluginOutcome
from fluffy.kernel.tools.plugins import PluginRunner
from fluffy.kernel.tools.registry import Registry, ToolSpec
from fluffy.kernel.tools.sanitizer import OutputSanitizer
from fluffy.kernel.tools.scheduling import CHANGING_KINDS, run_ordered
from fluffy.kernel.tools.testprep import TestPlan, TestPreparer
from fluffy.kernel.tools.workspace import Workspaces
from fluffy.kernel.workflow.coverage import CoverageReport, parse_coverage
from fluffy.kernel.workflow.evidence import TestRun, parse_junit
from fluffy.kernel.workflow.machine import Workflow
from fluffy.kernel.workflow.store import SessionRow

log = logging.getLogger("fluffy.kernel.tools")

READ_RETRY_DELAY_S = 0.1
#: An MCP call held for review shows the user all its arguments; longer ones are refused.
MAX_SHOWN_ARGUMENTS = 16_000
MAX_REPORT_BYTES = 32 * 1024 * 1024
_ENCODE = msgspec.json.Encoder(enc_hook=repr).encode
#: Runs a plugin call under the scheduler: (template, call id, coroutine factory,
#: priority).
Schedule = Callable[[str, str, Callable[[], Awaitable[Any]], int], Awaitable[Any]]
#: Asks the user about one call that policy holds for review (session id, what is
#: shown) -> {"decision": "allow" | "allow_session" | "deny", "reason": ...}.
Reviewer = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]

#: The priority of a call (ADR-043): a model turn's calls, which the user watches,
#: before a client's direct tool.call / tool.batch, both before background work.
TURN_PRIORITY = PRIORITY_HIGH
CALL_PRIORITY = PRIORITY_NORMAL


async def _direct(
    template: str, key: str, work: Callable[[], Awaitable[Any]], priority: int
) -> Any:
    return await work()


@dataclass
class _Call:
    spec: ToolSpec
    session: SessionRow
    args: dict[str, Any]
    call_id: str
    reads: frozenset[str]
    writes: frozenset[str]
    review: str | None = None  # a policy rule asked for review of this write
    timings: dict[str, float] | None = None  # a plugin call's (see PluginOutcome)
    sandbox_id: str | None = None  # the sandbox a plugin call ran in (one per call)
    capability: Scope | None = None  # a write in a sandbox: what its token covers
    token_ops: str | None = None  # "used/max" uses of the call's token (None: no token)
    token: str | None = None  # how the audit log names the call's token
    priority: int = CALL_PRIORITY  # its sandbox's scheduler priority
    reviewed: str | None = None  # an MCP call the user allowed (how)


class ToolRouter:
    def __init__(
        self,
        *,
        project: Path,
        registry: Registry,
        fast: FastPath,
        runner: PluginRunner | None,
        workflow: Workflow,
        policy: AuditedPolicy,
        audit: AuditLog | None,
        sanitizer: OutputSanitizer,
        breakers: BreakerBoard,
        workspaces: Workspaces,
        merger: Merger,
        settings: ToolSettings,
        protected: list[str],
        schedule: Schedule = _direct,
        accepting_work: Callable[[], bool] = lambda: True,
        tests: TestPreparer | None = None,
        mcp: McpServers | None = None,
    ) -> None:
        self.project = project
        self.registry = registry
        self.fast = fast
        self.runner = runner
        self.workflow = workflow
        self.policy = policy
        self.audit = audit
        self.sanitizer = sanitizer
        self.breakers = breakers
        self.workspaces = workspaces
        self.merger = merger
        self.settings = settings
        self.protected = protected
        self.schedule = schedule
        self.accepting_work = accepting_work
        #: orders a batch's dependent calls (None: a private scheduler per batch)
        self.steps: Scheduler | None = None
        #: test.run's environment and per-session view (None: no engine, no test runs)
        self.tests = tests
        #: the project's MCP servers (ADR-046); None: none registered
        self.mcp = mcp
        #: asks the user about a call held for review (set by the session loop)
        self.reviewer: Reviewer | None = None
        #: MCP tools the user allowed for the rest of a session (session id -> names)
        self.session_allowed: dict[str, set[str]] = {}
        self.flow = Flow(workflow, workspaces, merger, audit)
        self.scope = availability.WriteScope(
            workflow.test_globs, (*availability.PROTECTED_GLOBS, *protected)
        )

    # -- the public entry points ------------------------------------------------------
    def tools(self) -> list[ToolSpec]:
        return list(self.registry.specs.values())

    async def available(self, session_id: str) -> list[str]:
        session = await self.workflow.get(session_id)
        return availability.available(session.state, session.mode, self.tools())

    async def call(
        self,
        session_id: str,
        tool: str,
        args: Any,
        *,
        call_id: str | None = None,
        priority: int = CALL_PRIORITY,
    ) -> dict[str, Any]:
        started = time.perf_counter()
        client_call_id = call_id
        call_id = uuid.uuid4().hex[:12]  # the kernel's own: it names folders and tasks
        retries = 0
        call: _Call | None = None
        asked: list[dict[str, Any]] = []  # the policy requests decided for this call
        output: dict[str, Any] | FluffyError
        try:
            call = await self._prepare(session_id, tool, args, call_id, asked)
            call.priority = priority
            if call.spec.route == "plugin":  # a long call: its start is on record too
                await self._record_execute(call, attempt=1)
            while True:
                try:
                    output = await self._execute(call)
                    break
                except FluffyError as exc:
                    if not (call.spec.retried and exc.retryable and retries == 0):
                        raise
                    retries += 1
                    await asyncio.sleep(READ_RETRY_DELAY_S)
                    await self._record_execute(call, attempt=2, after=exc)
        except FluffyError as exc:
            output = exc
        except Exception as exc:  # a bug must still be an answer and an audit entry
            log.exception("%s failed unexpectedly", tool)
            output = ToolFailed(
                f"{tool} failed inside the kernel: {type(exc).__name__}",
                why=str(exc)[:500],
                fix="Retry once; if it persists, report it with the kernel's log.",
            )
        answer = await self._finish(
            call, tool, session_id, call_id, started, retries, output, asked, args
        )
        if client_call_id is not None:
            answer["client_call_id"] = client_call_id
        return answer

    async def batch(
        self, session_id: str, calls: list[dict[str, Any]], *, priority: int = CALL_PRIORITY
    ) -> list[dict[str, Any]]:
        """Several calls of one AI turn: in parallel unless their paths conflict; a call
        that conflicts with earlier ones is submitted depending on them (ADR-043)."""
        tools = [str(item.get("tool")) for item in calls]
        planned, changes = self.plan(tools, [item.get("args") or {} for item in calls])
        return await run_ordered(
            self.steps,
            planned,
            tools,
            changes,
            lambda i: self.call(
                session_id, tools[i], calls[i].get("args") or {}, priority=priority
            ),
            lambda i, exc: self.refused(session_id, tools[i], calls[i].get("args") or {}, exc),
            priority=priority,
        )

    def plan(self, tools: list[str], args: list[Any]) -> tuple[list[PlannedCall], list[bool]]:
        """What each call of a response touches, and whether it changes something."""
        planned: list[PlannedCall] = []
        changes: list[bool] = []
        for index, (tool, arguments) in enumerate(zip(tools, args, strict=True)):
            try:
                spec = self.registry.get(tool)
                reads, writes = self._paths(spec, arguments)
                changing = spec.kind in CHANGING_KINDS
            except FluffyError:  # the call itself will refuse
                reads, writes, changing = frozenset(), frozenset(), False
            planned.append(PlannedCall(index, reads, writes))
            changes.append(changing)
        return planned, changes

    async def refused(
        self, session_id: str, tool: str, args: Any, error: FluffyError
    ) -> dict[str, Any]:
        """The answer (and tool_result entry) of a call that was never run."""
        call_id = uuid.uuid4().hex[:12]
        started = time.perf_counter()
        return await self._finish(None, tool, session_id, call_id, started, 0, error, [], args)

    # -- preparing: the checks before anything runs ---------------------------------------
    def _write_path(self, raw: Any) -> str:
        if not isinstance(raw, str):
            raise ToolInputInvalid("`path` must be a string")
        rel = self.fast.rel(raw)  # symlinks resolved: a link to the policy *is* the policy
        try:
            return safe_relpath(rel)
        except MergeRefused as exc:
            raise ToolInputInvalid(f"cannot write {raw!r}", why=exc.why, fix=exc.fix) from None

    def _paths(self, spec: ToolSpec, args: Any) -> tuple[frozenset[str], frozenset[str]]:
        if not isinstance(args, dict):
            raise ToolInputInvalid(f"{spec.name}: arguments must be an object")
        reads, writes = spec.paths(args)
        if spec.kind == "write":
            rel = self._write_path(args.get("path"))
            return frozenset({rel}), frozenset({rel})
        if spec.kind == "read" and (spec.name.startswith("fs.") or "path" in args):
            # the policy sees what is read (search.grep's folder too)
            return frozenset({self.fast.rel(str(args.get("path", ".")))}), frozenset()
        return reads, writes

    async def _prepare(
        self, session_id: str, tool: str, args: Any, call_id: str, asked: list[dict[str, Any]]
    ) -> _Call:
        session = await self.workflow.get(session_id)
        spec = self.registry.get(tool)
        args = dict(args) if isinstance(args, dict) else args
        reads, writes = self._paths(spec, args)
        if spec.kind == "write" or (spec.kind == "read" and tool.startswith("fs.")):
            # the tool works on the path that was checked (symlinks resolved once)
            args["path"] = next(iter(writes or reads))
        if spec.route in ("fast", "kernel"):
            parse_args(tool, args)  # refuse bad arguments before policy sees them
        if spec.route == "mcp":
            if self.mcp is None:
                raise ToolNotFound(f"there is no MCP tool {tool!r}")
            self.mcp.check_arguments(tool, args)
        if spec.kind != "workflow":
            availability.check(
                tool,
                spec.kind,
                session.state,
                session.mode,
                sorted(writes),
                self.tools(),
                scope=self.scope,
            )
        if spec.route == "plugin" and not self.accepting_work():
            raise KernelOverloaded(
                f"{tool} was not started: the kernel is short of memory",
                fix="Wait for running work to finish, then call again.",
            )
        call = _Call(spec, session, args, call_id, reads, writes)
        self._authorise(call, asked)
        return call

    def _authorise(self, call: _Call, asked: list[dict[str, Any]]) -> None:
        """The policy's say on each path the call names; ``asked`` gets each request (as
        data: the meta-policy trial replays them from the call's audit entry)."""
        spec = call.spec
        if spec.route == "plugin" and spec.plugin:
            caller = Caller(spec.plugin, frozenset({"ai", "core_plugin"}))
        elif spec.route == "mcp" and spec.plugin:  # an MCP server: third-party code
            caller = Caller(spec.plugin, frozenset({"ai", "mcp", "third_party"}))
        else:
            caller = Caller("ai", frozenset({"ai"}))
        size = self._size_after(call)
        named = [p for p in sorted(call.writes) if p] or [
            p for p in sorted(call.reads) if p not in ("", ".")
        ]
        targets: list[str | None] = [*named] or [None]  # None: the whole project
        # a write in a sandbox is checked before its token is issued (ADR-041): every
        # change the sandbox returns is then checked against the token
        issuing = spec.route == "plugin" and spec.kind == "write" and bool(call.writes)
        if issuing:
            call.capability = Scope(spec.name, tuple(sorted(call.writes)))
        for path in targets:
            request = Request(
                syscall=spec.name,
                caller=caller,
                path=path if path not in (None, ".") else None,
                state=call.session.state,
                mode=call.session.mode,
                size=size,
                sandbox=spec.template if spec.route in ("plugin", "mcp") else None,
                issuing=issuing,
            )
            asked.append(request_data(self.policy.as_evaluated(request)))
            decision = self.policy.evaluate(request)
            if decision.result == "deny":
                by = decision.decided_by  # the rule's name: the user knows what to change
                raise PolicyError(
                    f"policy denied {spec.name}" + (f" on {path}" if path else ""),
                    why=("; ".join(decision.reasons) or "no rule allows it (default deny)")
                    + (f" (rule {by})" if by else ""),
                    fix=_denied_fix(by),
                )
            if decision.result == "require_review":
                if spec.kind == "external":  # an MCP call: the user is asked before it runs
                    call.review = "; ".join(decision.reasons) or f"{spec.name} needs review"
                    continue
                if spec.kind != "write":
                    raise PolicyError(
                        f"{spec.name} needs the user's review",
                        why="; ".join(decision.reasons),
                        fix="Only writes can wait for review (in reviewing); ask the user.",
                    )
                call.review = "; ".join(decision.reasons) or f"{spec.name} {path} needs review"

    def _size_after(self, call: _Call) -> int | None:
        """The size a write leaves its file at (for max_file_size); None: not a write."""
        args = call.args
        if call.spec.kind != "write":
            return None
        if call.spec.name == "fs.delete":
            return 0
        if isinstance(args.get("content"), str):
            return len(args["content"].encode())
        found = self.fast.content(next(iter(call.writes)), self.workspaces.get(call.session.id))
        old, new = args.get("old_string"), args.get("new_string")
        if found is None or not isinstance(old, str) or not isinstance(new, str):
            return None
        # arithmetic, never the edited text: 20 KB of matches times a 100 KB replacement
        # would build gigabytes in the kernel before the policy could refuse the size
        text = found[0].decode("utf-8", "replace")
        matches = text.count(old) if old else len(text) + 1
        if not args.get("replace_all"):
            matches = min(matches, 1)
        return len(found[0]) + matches * (len(new.encode()) - len(old.encode()))

    # -- executing ----------------------------------------------------------------------
    async def _execute(self, call: _Call) -> dict[str, Any]:
        spec, session = call.spec, call.session
        if spec.name == "plan.complete":
            steps = await self.flow.plan_complete(session.id)
            self._expect(session, "fs.write")  # writes come next: have their sandbox ready
            return {"workflow": [s.to_dict() for s in steps]}
        if spec.name == "workflow.request_exemption":
            args = parse_args(spec.name, call.args)
            held = await self.workflow.hold_exemption(
                session.id, args.category, list(args.paths), args.reason
            )
            return {
                "held_for_review": True,
                "exemption": held.data["exemption_pending"],
                "note": "The user decides on this exemption; the workflow waits for the "
                "answer. Nothing is exempt until the user grants it.",
            }
        if spec.name == "workflow.add_tests":
            reason = parse_args(spec.name, call.args).reason
            return await self.flow.request_tests(session.id, reason)
        stage = self.workspaces.get(session.id)
        if spec.route == "fast" and (self.settings.fast_path or spec.module is None):
            if spec.name.startswith("search."):
                return await asyncio.to_thread(self.fast.run, spec.name, call.args, stage)
            return self.fast.run(spec.name, call.args, stage, normalized=True)
        if spec.name == "test.run":
            return await self._test_run(call)
        if spec.route == "mcp":
            return await self._mcp(call)
        outcome = await self._plugin(call)
        try:
            if spec.kind == "write":
                return await self._stage(call, outcome)
            if spec.name == "git.commit":
                return await self._commit(call, outcome)
            return outcome.result
        finally:
            assert self.runner is not None
            await self.runner.release(outcome)

    async def _plugin(self, call: _Call, test: TestPlan | None = None) -> PluginOutcome:
        """Run the call in its plugin's sandbox (a test run: in its view and environment)."""
        spec = call.spec
        if self.runner is None or spec.plugin is None or spec.module is None:
            raise EngineUnavailable(
                f"{spec.name} needs a sandbox, and this kernel has no container engine",
                fix="Start Docker or Podman (`scripts/setup`), then restart the kernel.",
            )
        runner, plugin, module = self.runner, spec.plugin, spec.module
        stage = self.workspaces.get(call.session.id)
        project: Path = self.project
        staged: Path | None = stage.root
        if test is not None:  # the session's view, one folder (testview)
            project, staged = test.synced.folder, None
        elif self.tests is not None and self.tests.mirror_needed():
            project, staged = await asyncio.to_thread(self._mirror, call, stage), None
        ticket = self.breakers.before(plugin)
        try:
            outcome: PluginOutcome = await self.schedule(
                spec.template,
                call.call_id,
                lambda: runner.run(
                    plugin=plugin,
                    module=module,
                    template=spec.template,
                    call_id=call.call_id,
                    tool=spec.name,
                    args=call.args,
                    session_mode=call.session.mode,
                    project=project,
                    staged_dir=staged,
                    timeout_s=self.settings.call_timeout_s,
                    image=test.image if test is not None else None,
                    settings=test.settings if test is not None else None,
                    capability=call.capability,
                ),
                call.priority,
            )
        except BaseException as exc:
            if counts_as_failure(exc) and not isinstance(exc, KernelOverloaded):
                # the plugin broke (not: the tool said no, or the kernel stopped it)
                self.breakers.failure(ticket, exc)
            else:
                self.breakers.release(ticket)
            raise
        self.breakers.success(ticket)
        call.timings = {k: round(v, 3) for k, v in outcome.timings.items()}
        call.sandbox_id = outcome.sandbox.sandbox_id
        return outcome

    async def _mcp(self, call: _Call) -> dict[str, Any]:
        """An MCP server's tool: the user's yes first when policy asks for review."""
        assert self.mcp is not None
        if call.review is not None:
            await self._ask_user(call)
        result = await self.mcp.call(call.spec.name, call.args, self.settings.call_timeout_s)
        running = self.mcp.running.get(call.spec.name.split(".")[1])
        call.sandbox_id = running.connection.sandbox_id if running else None
        return result

    async def _ask_user(self, call: _Call) -> None:
        spec, sid = call.spec, call.session.id
        if spec.name in self.session_allowed.get(sid, set()):
            call.reviewed = "allowed for this session by the user"
            return
        family = spec.name.rsplit(".", 1)[0]
        if self.reviewer is None or call.priority != TURN_PRIORITY:
            raise PolicyError(
                f"{spec.name} needs the user's review",
                why=(call.review or "")
                + "; only a model's turn asks the user (this call came from a client)",
                fix=f"Allow it with a policy rule (syscall: {family}.*, action: allow).",
            )
        # the user sees every argument the server will get, or is not asked at all
        shown_args = json.dumps(call.args, sort_keys=True, ensure_ascii=False, indent=1)
        if len(shown_args) > MAX_SHOWN_ARGUMENTS:
            raise ToolRefused(
                f"{spec.name} was not run: its arguments are too long to show the user",
                why=f"{len(shown_args)} characters; a call is reviewed only in full "
                f"(at most {MAX_SHOWN_ARGUMENTS})",
                fix=f"Call it with shorter arguments, or ask the user to allow {family}.* "
                "with a policy rule.",
            )
        shown = {
            "review_id": call.call_id,
            "tool": spec.name,
            "arguments": shown_args,
            "reason": call.review,
            "description": spec.description[:300],
        }
        decision = await self.reviewer(sid, shown)
        said = str(decision.get("decision"))
        if said == "allow_session":
            self.session_allowed.setdefault(sid, set()).add(spec.name)
            call.reviewed = "allowed for this session by the user"
        elif said == "allow":
            call.reviewed = "allowed once by the user"
        else:
            reason = str(decision.get("reason") or "").strip()
            raise ToolRefused(
                f"the user refused {spec.name}",
                why=(f'they said: "{reason}"' if reason else "the call was held for review")
                + f" ({call.review})",
            )

    def _expect(self, session: SessionRow, tool: str) -> None:
        """Warm the pool for the session's next ``tool`` call (a sandbox of its recipe);
        a hint only: whatever goes wrong is logged, never the call's failure."""
        try:
            self._warm(session, tool)
        except Exception:
            log.exception("could not warm a sandbox for %s", tool)

    def _warm(self, session: SessionRow, tool: str) -> None:
        runner = self.runner
        if runner is None or runner.pool is None:
            return
        if self.tests is not None and self.tests.mirror_needed():
            return  # its sandboxes mount the session's copy, made at the call
        try:
            spec = self.registry.get(tool)
        except FluffyError:
            return
        if spec.plugin is None or spec.module is None:
            return
        recipe = runner.recipe(
            plugin=spec.plugin,
            module=spec.module,
            template=spec.template,
            project=self.project,
            staged_dir=self.workspaces.get(session.id).root,
            timeout_s=self.settings.call_timeout_s,
        )
        runner.pool.expect(recipe)

    def _mirror(self, call: _Call, stage: Any) -> Path:
        """The kernel's copy of the view for a sandbox that cannot read the project."""
        assert self.tests is not None
        git = call.spec.name.startswith("git.") or (
            call.spec.route == "plugin"
            and (call.spec.plugin not in ("fs-tool", "search-tool", "test-tool"))
        )
        return self.tests.mirror(
            call.session.id, stage.overlay(), stage.tree, self.workflow.test_globs, git=git
        )

    async def _stage(self, call: _Call, outcome: PluginOutcome) -> dict[str, Any]:
        changes = outcome.result.get("changes")
        if not isinstance(changes, list):
            raise MergeRefused(f"{call.spec.name} returned no change list")
        for change in changes:
            path = change.get("path") if isinstance(change, dict) else None
            if path not in call.writes:
                raise MergeRefused(
                    f"{call.spec.plugin} tried to change {path!r}, which this call was not "
                    f"allowed to write",
                    why=f"the call was authorised for {', '.join(sorted(call.writes))} only",
                )
        self._check_uses(call, outcome, changes)
        async with self.flow.lock(call.session.id):
            now = await self.workflow.get(call.session.id)
            if now.state != call.session.state:
                raise ToolUnavailable(
                    f"{call.spec.name} finished after the session moved on to {now.state}",
                    tool_name=call.spec.name,
                    current_state=now.state,
                    reason=f"it was allowed in {call.session.state}; nothing was staged",
                    available_tools=await self.available(now.id),
                )
            stage = self.workspaces.get(call.session.id)
            staged = await asyncio.to_thread(
                ingest, outcome.call_dir, changes, stage, protected=self.protected
            )
        if call.review:
            reasons = list(call.session.data.get("review_required", []))
            await self.workflow.annotate(
                call.session.id, "review_required", review_required=[*reasons, call.review]
            )
        diff = await asyncio.to_thread(stage.diff)
        return {
            "staged": [c.path for c in staged],
            "note": "staged: tests and reads see it now; the project changes when the "
            "merge is approved in reviewing",
            "review_required": call.review,
            "diff": diff[-8000:],
        }

    def _check_uses(self, call: _Call, outcome: PluginOutcome, changes: list[Any]) -> None:
        """Each change is one use of the call's token, presented by the sandbox with a
        nonce: checked by the policy engine (token fast path, built-ins still run).  A
        change the token does not cover -- another path, a use too many, a replayed
        nonce, a token of another sandbox or connection -- is refused: nothing staged."""
        token = outcome.token
        if call.capability is None:
            return
        if token is None:
            if getattr(self.runner, "capabilities", None) is None:
                return  # this kernel issues no tokens (no engine: tests)
            raise MergeRefused(
                f"{call.spec.plugin} returned changes without the call's capability token",
                why="its host never took a token for this call",
                fix="Nothing was staged; call the tool again.",
            )
        spec, session = call.spec, call.session
        presented = outcome.result.get("capability")
        token_id = presented.get("token") if isinstance(presented, dict) else None
        uses = presented.get("uses") if isinstance(presented, dict) else None
        uses = uses if isinstance(uses, list) else []
        caller = Caller(
            spec.plugin or "plugin",
            frozenset({"ai", "core_plugin"}),
            token.container_id,
            outcome.connection,
        )
        used = 0
        for index, change in enumerate(changes):
            path = change.get("path") if isinstance(change, dict) else None
            use = uses[index] if index < len(uses) and isinstance(uses[index], dict) else {}
            nonce = use.get("nonce")
            shown = (
                TokenUse(token_id, nonce)
                if isinstance(token_id, str)
                and use.get("path") == path
                and isinstance(nonce, int)
                and not isinstance(nonce, bool)
                else None
            )
            decision = self.policy.evaluate(
                Request(
                    syscall=spec.name,
                    caller=caller,
                    path=path if isinstance(path, str) else None,
                    state=session.state,
                    mode=session.mode,
                    sandbox=spec.template,
                    token=shown,
                )
            )
            if decision.result != "allow" or not decision.by_token:
                raise MergeRefused(
                    f"{spec.plugin}'s change to {path!r} was not covered by the call's "
                    "capability token",
                    why="; ".join(decision.reasons)
                    if decision.result == "deny" and decision.decided_by
                    else "a change needs the call's token, for its own path, once, with a "
                    "nonce greater than the last (none, another or a replayed one was shown)",
                    fix="Nothing was staged; call the tool again.",
                )
            used += 1
        call.token = token_ref(token.token_id)
        call.token_ops = f"{used}/{token.max_ops}"

    async def _commit(self, call: _Call, outcome: PluginOutcome) -> dict[str, Any]:
        result = await asyncio.to_thread(self.merger.merge_git, outcome.call_dir, outcome.result)
        problems = [*result.conflicts, *result.refused]
        if result.status != "completed" or problems:
            raise MergeConflict(
                "the commit was prepared but not applied to the repository",
                why="; ".join(f"{p.path}: {p.reason}" for p in problems) or result.status,
                fix="Look at `git status` and `git log`, then call git.commit again.",
            )
        steps = await self.flow.committed(call.session.id)
        return {
            "commit": outcome.result.get("commit"),
            "ref": outcome.result.get("ref"),
            "files": outcome.result.get("files", []),
            "merged": list(getattr(result, "merged", [])),
            "workflow": [s.to_dict() for s in steps],
        }

    async def _test_run(self, call: _Call) -> dict[str, Any]:
        session_id = call.session.id
        before = await self.flow.before_test_run(session_id)
        if self.tests is None:
            raise EngineUnavailable(
                "test.run needs a sandbox, and this kernel has no container engine",
                fix="Start Docker or Podman (`scripts/setup`), then restart the kernel.",
            )
        stage = self.workspaces.get(session_id)
        # the evidence's tree hashes are the kernel's: of the view it lays down for the run
        state = (await self.workflow.get(session_id)).state
        plan = await asyncio.to_thread(
            self.tests.prepare,
            session_id,
            stage.overlay(),
            stage.tree,
            self.workflow.test_globs,
            coverage=state != "test_writing",  # the tech-debt budget reads green runs only
        )
        tests, sources = plan.synced.tests, plan.synced.sources
        started = time.time()
        clock = time.monotonic()
        outcome = await self._plugin(call, plan)
        try:
            result = outcome.result
            junit = _output_file(outcome, result.get("junit"))
            cases = (
                parse_junit(junit, name="the test run's junit report", any_failure=plan.custom)
                if junit
                else []
            )
            coverage: CoverageReport | None = None
            raw_coverage = _output_file(outcome, result.get("coverage"))
            if raw_coverage:
                try:
                    coverage = parse_coverage(raw_coverage, name="coverage.json")
                except FluffyError:
                    coverage = None
            exit_code = int(result.get("exit_code", -1))
        finally:
            assert self.runner is not None
            await self.runner.release(outcome)
        if junit is None and exit_code not in (0, 5):
            raise ToolInputInvalid(
                f"test.run: pytest exited with {exit_code} and wrote no report",
                why=str(result.get("output_tail", ""))[-1500:],
                fix="Fix the collection error shown, then run the tests again.",
            )
        run = TestRun(
            command=("test.run", json.dumps(call.args, sort_keys=True)),
            exit_code=exit_code,
            cases=tuple(cases),
            tests=tests,
            sources=sources,
            started_at=started,
            duration_s=time.monotonic() - clock,
        )
        await self.workflow.record_test_run(session_id, run, coverage)
        verdict = (
            await self.workflow.red_verdict(session_id, run) if state == "test_writing" else None
        )
        after, review = await self.flow.after_test_run(session_id, run)
        failed = [
            {"id": c.id, "message": c.message[:500]}
            for c in cases
            if c.outcome in ("failed", "error")
        ]
        answer: dict[str, Any] = {
            "exit_code": exit_code,
            "counts": run.counts,
            "failed": failed[:50],
            "coverage_percent": None if coverage is None else round(coverage.percent, 2),
            "output_tail": str(result.get("output_tail", ""))[-4000:],
            "workflow": [s.to_dict() for s in (*before, *after)],
        }
        if verdict is not None:  # test_writing: red or not, and why (what the user sees)
            answer["red"], answer["red_reason"] = verdict
        if plan.choice is not None and plan.choice.note:
            answer["environment"] = plan.choice.note
        said = " ".join([str(result.get("output_tail", "")), *(c.message for c in cases)])
        limit = _limit_hit(said, call.spec.template)
        if limit:
            answer["limits"] = limit
        if review is not None:
            answer["review"] = review
        if review is not None and (await self.workflow.get(session_id)).state == "committing":
            self._expect(call.session, "git.commit")  # merged: the commit comes next
        return answer

    # -- finishing: sanitise, audit, answer ----------------------------------------------
    async def _finish(
        self,
        call: _Call | None,
        tool: str,
        session_id: str,
        call_id: str,
        started: float,
        retries: int,
        output: dict[str, Any] | FluffyError,
        asked: list[dict[str, Any]],
        args: Any,
    ) -> dict[str, Any]:
        duration_ms = (time.perf_counter() - started) * 1000
        route = call.spec.route if call is not None else None
        if isinstance(output, FluffyError):
            answer: dict[str, Any] = {"ok": False, "error": output.to_dict()}
            original: Any = answer["error"]
            meta = {"error_code": output.code}
        else:
            cleaned = self.sanitizer.sanitize(tool, output)
            answer = {"ok": True, "output": cleaned.value}
            original = output
            meta = {
                "original_chars": str(cleaned.original_chars),
                "sanitized_chars": str(cleaned.sanitized_chars),
                "truncated": str(cleaned.truncated).lower(),
                "redactions": str(cleaned.redactions),
            }
            if cleaned.redacted_kinds:
                meta["redacted_kinds"] = ",".join(cleaned.redacted_kinds)
        if call is not None and call.spec.kind in ("read", "external"):  # changes no session
            session: dict[str, Any] | None = {
                "session_id": call.session.id,
                "mode": call.session.mode,
                "state": call.session.state,
            }
        else:
            session = await self._session_view(session_id)
        answer.update(
            tool=tool,
            call_id=call_id,
            route=route,
            duration_ms=round(duration_ms, 3),
            retries=retries,
            session=session,
        )
        if call is not None and call.timings is not None:
            answer["timings"] = call.timings
        encoded = _ENCODE(original)  # the hash of what the tool gave, before sanitising
        await self._record(
            "tool_result",
            call,
            session_id,
            tool,
            input_summary=summarize(call.args if call is not None else args),
            output_summary=summarize(answer.get("output", answer.get("error"))),
            decision=_decision(call, output),
            duration_ms=duration_ms,
            sandbox_id=call.sandbox_id if call is not None else None,
            metadata={
                "call_id": call_id,
                "original_sha256": hashlib.sha256(encoded).hexdigest(),
                "retries": str(retries),
                **meta,
                **({"policy_requests": _ENCODE(asked).decode()} if asked else {}),
                **(
                    {"capability": call.token, "capability_ops": call.token_ops}
                    if call is not None and call.token is not None and call.token_ops
                    else {}
                ),
                **({"review": call.reviewed} if call is not None and call.reviewed else {}),
                **(
                    {"sandbox_warm": "true" if call.timings.get("warm") else "false"}
                    if call is not None and call.timings
                    else {}
                ),
            },
        )
        return answer

    async def _session_view(self, session_id: str) -> dict[str, Any] | None:
        try:
            session = await self.workflow.get(session_id)
        except FluffyError:
            return None
        return {"session_id": session.id, "mode": session.mode, "state": session.state}

    async def _record_execute(
        self, call: _Call, *, attempt: int, after: FluffyError | None = None
    ) -> None:
        meta = {"call_id": call.call_id, "attempt": str(attempt), "route": call.spec.route}
        if after is not None:
            meta["retry_after"] = after.code
        if call.review:
            meta["review_required"] = call.review
        await self._record(
            "tool_execute",
            call,
            call.session.id,
            call.spec.name,
            input_summary=summarize(call.args),
            decision="allowed" if not call.review else "review_required",
            metadata=meta,
        )

    async def _record(
        self,
        kind: str,
        call: _Call | None,
        session_id: str,
        tool: str,
        *,
        input_summary: str,
        output_summary: str | None = None,
        decision: str | None = None,
        duration_ms: float | None = None,
        sandbox_id: str | None = None,
        metadata: dict[str, str],
    ) -> None:
        if self.audit is None:
            return
        session = call.session if call is not None else None
        self.audit.record_nowait(
            Event(
                kind,
                caller="ai",
                session_id=session_id,
                session_mode=session.mode if session else "strict",
                state_machine_state=session.state if session else "idle",
                syscall_type=tool,
                policy_decision=decision,
                input_summary=input_summary,
                output_summary=output_summary,
                duration_ms=None if duration_ms is None else round(duration_ms, 3),
                sandbox_id=sandbox_id,
                metadata=metadata,
            )
        )


def _denied_fix(rule: str | None) -> str:
    """Where the refusing rule lives, so the user knows what to change."""
    if rule is not None and rule.startswith("ext:"):
        return (
            f"The project's extension rule {rule[4:]} (.fluffy/rules) refuses it: ask the "
            "user to change the rule (fluffy config rules set), or do something else."
        )
    if rule is not None and rule.startswith("builtin:"):
        return "A built-in rule protects this; no policy allows it. Do something else."
    return (
        "Ask the user to allow it in .fluffy/policy.yaml (fluffy config policy edit), or "
        "do something else."
    )


def _decision(call: _Call | None, output: Any) -> str | None:
    """The policy decision a tool_result entry carries."""
    if isinstance(output, FluffyError):
        refused = output.code.startswith(("policy.", "tool.unavailable", "tool.refused"))
        return "denied" if refused else ("allowed" if call is not None else None)
    if call is None:
        return None
    if call.review:
        return "review_required"
    return "allowed_by_token" if call.token_ops else "allowed"


#: What a test's output says when the sandbox's pid limit stopped it.
_PID_LIMIT = ("can't start new thread", "Resource temporarily unavailable", "[Errno 11]")


def _limit_hit(output: str, template: str) -> str | None:
    """A note when the tests ran into the sandbox's process limit (not the code's bug)."""
    if not any(sign in output for sign in _PID_LIMIT):
        return None
    from fluffy.kernel.containers.config import TEMPLATES

    pids = TEMPLATES[template].max_pids if template in TEMPLATES else "a few"
    return (
        f"the test sandbox allows {pids} processes and threads in all (the {template} "
        "template's limit); a test that starts more fails there, not in the code"
    )


def _output_file(outcome: PluginOutcome, name: Any) -> bytes | None:
    """A file the plugin named in its result, read without following links (capped)."""
    if not isinstance(name, str) or not name:
        return None
    data: bytes = read_regular(outcome.call_dir, safe_relpath(name), MAX_REPORT_BYTES)
    return data
