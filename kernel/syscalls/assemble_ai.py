"""Build the AI session layer of a kernel: proxy, provider runner, memory, loop, methods."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

import msgspec

from fluffy.kernel.ai.conversation import ConversationStore
from fluffy.kernel.ai.instructions import Instructions, read_instructions
from fluffy.kernel.ai.loop import InstructionSource, SessionLoop
from fluffy.kernel.ai.memory import Memory
from fluffy.kernel.ai.provider import ProviderRunner
from fluffy.kernel.audit.entry import Event
from fluffy.kernel.audit.log import AuditLog
from fluffy.kernel.audit.observer import SyscallAuditor
from fluffy.kernel.ipc.syscalls import SyscallTable
from fluffy.kernel.mcp import PROXY_TAG as MCP_TAG
from fluffy.kernel.net.allowlist import AllowList
from fluffy.kernel.net.dial import gate_dialler
from fluffy.kernel.net.proxy import ConnectProxy, ProxyRecord
from fluffy.kernel.policy.model import PolicyFile
from fluffy.kernel.syscalls.ai import ai_methods, with_review_hooks
from fluffy.kernel.syscalls.assemble_tools import ToolPath

log = logging.getLogger("fluffy.kernel.ai")


class AiLayer(msgspec.Struct):
    loop: SessionLoop
    proxy: ConnectProxy
    runner: ProviderRunner
    store: ConversationStore

    #: policy.yaml session.max_rounds: the ceiling of a turn's model rounds
    max_rounds: int = 50

    def methods(self, tool_methods: SyscallTable) -> SyscallTable:
        """The session methods, and the review methods hooked to wake waiting turns."""
        hooked = with_review_hooks(tool_methods, self.loop)
        return SyscallTable(hooked, ai_methods(self.loop, max_rounds=lambda: self.max_rounds))

    def reload(self, policy: PolicyFile) -> None:
        self.proxy.reload(AllowList.from_entries(policy.network_whitelist))
        self.loop.quarantine_after = policy.session.quarantine_after
        self.max_rounds = policy.session.max_rounds

    async def close(self) -> None:
        await self.loop.close()
        await self.runner.close()
        await self.proxy.close()
        await self.store.close()


def proxy_auditor(audit: AuditLog | None) -> Callable[[ProxyRecord], Awaitable[None]]:
    async def record(item: ProxyRecord) -> None:
        if audit is None:
            return
        decision = {"allow": "allowed", "deny": "denied"}.get(item.decision)
        mcp = item.tag.startswith(MCP_TAG)  # an MCP server's socket: mcp:NAME
        await audit.record(
            Event(
                "network_request",
                caller=f"sandbox:mcp-{item.tag[len(MCP_TAG) :]}" if mcp else "sandbox:ai-provider",
                tool_name=f"mcp.{item.tag[len(MCP_TAG) :]}" if mcp else None,
                session_id=None if mcp else item.session or item.tag or None,
                syscall_type="net.connect",
                policy_decision=decision if item.phase == "decision" else None,
                policy_rule_name=item.rule,
                deny_reason=item.reason if item.decision == "deny" else None,
                input_summary=f"CONNECT {item.host}:{item.port}",
                output_summary=f"{item.status} {item.reason}".strip(),
                duration_ms=item.duration_ms or None,
                metadata={
                    "phase": item.phase,
                    "decision": item.decision,
                    "bytes_up": str(item.bytes_up),
                    "bytes_down": str(item.bytes_down),
                    **({"host_rule": item.host_rule} if item.host_rule else {}),
                },
            )
        )

    return record


def instructions_reader(project: Path, audit: AuditLog | None) -> InstructionSource:
    """Reads the project's instruction files and records each read in the audit log."""

    async def load(session_id: str | None, caller: str) -> Instructions:
        found = await asyncio.to_thread(read_instructions, project)
        if audit is None:
            return found
        metadata = {"digest": found.digest, "limit": str(found.limit)}
        for item in found.files:
            metadata[f"file:{item.path}"] = (
                f"skipped: {item.skipped}"
                if item.skipped
                else f"size={item.size} used={item.used} sha256={item.sha256}"
            )
        used = sum(item.used for item in found.loaded)
        await audit.record(
            Event(
                "project_instructions_read",
                caller=caller,
                session_id=session_id,
                syscall_type="fs.read",
                input_summary=", ".join(item.path for item in found.files) or "(none)",
                output_summary=f"{len(found.loaded)} file(s), {used} bytes"
                + (" (truncated)" if found.truncated else ""),
                metadata=metadata,
            )
        )
        return found

    return load


async def assemble_ai(
    state_dir: Path,
    policy: PolicyFile,
    tools: ToolPath,
    audit: AuditLog | None,
    *,
    launcher: Literal["sandbox", "process"] | None = None,
    context_window: int = 128_000,
) -> AiLayer:
    proxy = ConnectProxy(
        AllowList.from_entries(policy.network_whitelist),
        proxy_auditor(audit),
        session_of=lambda tag: tag or None,
        dial=gate_dialler(),  # in L1 (network none) the engine gate dials for the proxy
    )

    async def start_proxy(
        path: Path,
        tag: str,
        mode: int,
        owner: tuple[int, int] | None,
        hosts: AllowList | None = None,
    ) -> Callable[[], Awaitable[None]]:
        await proxy.start(path, tag=tag, mode=mode, owner=owner, hosts=hosts)

        async def stop() -> None:
            await proxy.stop(path)

        return stop

    sandboxes = tools.sandboxes
    runner = ProviderRunner(
        state_dir,
        manager=sandboxes.manager if sandboxes is not None else None,
        start_proxy=start_proxy,
        # never a silent fallback to an unsandboxed child: without sandboxes a turn fails
        # closed (ProviderRunner.open says why); "process" is for tests that ask for it
        launcher=launcher or "sandbox",
        observer=SyscallAuditor(audit, lambda: tools.flow.workflow.current)
        if audit is not None
        else None,
    )
    runner.slots = tools.scheduler  # every turn's sandbox under the limits (ADR-043)
    if tools.mcp is not None:  # MCP servers with allowed_hosts (ADR-046)
        tools.mcp.start_proxy = start_proxy
    store = await ConversationStore.open(state_dir)
    memory = Memory(store, context_window=context_window, test_globs=tools.flow.workflow.test_globs)

    async def audit_quarantine(session_id: str, summary: str, metadata: dict[str, str]) -> None:
        if audit is not None:
            await audit.record(
                Event(
                    "session_quarantined",
                    caller="kernel",
                    session_id=session_id,
                    input_summary=summary,
                    metadata=metadata,
                )
            )

    loop = SessionLoop(
        tools.router,
        tools.flow,
        runner,
        memory,
        audit=audit_quarantine,
        durable=audit.commit_pending if audit is not None else None,
        quarantine_after=policy.session.quarantine_after,
        instructions=instructions_reader(tools.router.project, audit),
    )
    return AiLayer(loop, proxy, runner, store, policy.session.max_rounds)
