"""Results of the kernel's administrative syscalls: ping, audit, policy, project, plugins, MCP."""

from __future__ import annotations

from typing import Literal

from fluffy.ipc.results import Part, Result

# -- kernel.ping -------------------------------------------------------------------------


class CallerIdentity(Part):
    """Who is calling, as the kernel sees the connection (kernel.ping's ``identity``)."""

    #: the socket's binding: ``cli``, ``tool:...``, ``ai:...``, ``policy-sandbox``
    binding: str
    plugin_name: str
    #: 0 when the peer is in a pid namespace the kernel cannot see
    peer_pid: int
    peer_uid: int
    peer_gid: int
    #: the peer's container, where its pid is visible
    container_id: str | None


class AuditHead(Part):
    """The newest committed audit entry: what an outside witness may keep."""

    chain_id: str
    seq: int
    hash: str


class WarmPool(Part):
    """The warm pool of idle sandboxes: its state and counters since the kernel started."""

    enabled: bool
    #: idle sandboxes ready to be taken
    idle: int
    #: sandboxes being made now
    making: int
    #: idle sandboxes the pool may hold (max_idle, within its memory budget)
    capacity: int
    #: recipes (template and settings) with idle sandboxes
    recipes: int
    #: whether memory was short when the filler last looked
    under_pressure: bool
    made: int
    taken: int
    missed: int
    stale: int
    drained: int
    failed: int


class KernelMemory(Part):
    """The kernel's memory as its cgroup reports it, and the warm pool's figures."""

    #: ``shed``: new work refused at 80 %; ``evict``: sandboxes destroyed at 90 %
    level: Literal["ok", "shed", "evict", "unknown"]
    #: bytes in use (None: not read yet, or no cgroup figures)
    usage: int | None
    #: bytes allowed (None: unlimited or unknown)
    limit: int | None
    #: None: the kernel runs no warm pool
    pool: WarmPool | None


class TaskCounts(Part):
    """The tasks the scheduler knows, by state (every state, 0 when none)."""

    queued: int
    waiting_dependency: int
    running: int
    paused: int
    completed: int
    failed: int
    cancelled: int


class SchedulerLimits(Part):
    """The scheduler's concurrency limits (policy.yaml ``scheduler:``)."""

    global_max: int
    #: template name -> slots it may hold (a map keyed by the policy's template names)
    per_template: dict[str, int]


class KernelScheduler(Part):
    """The scheduler's figures: tasks by state, slots held, the queue, preemptions."""

    by_state: TaskCounts
    #: template name -> running tasks holding a slot of it
    running_by_template: dict[str, int]
    #: priority (1-5, as a string: JSON keys) -> tasks holding a slot
    running_by_priority: dict[str, int]
    #: effective priority (as a string) -> tasks queued
    queued_by_priority: dict[str, int]
    #: running tasks that give their slot up to better priorities
    yielding: int
    #: slots held beyond a limit (reservations, yielding slots not yet given back)
    over_limit: int
    accepting_work: bool
    paused_total: int
    resumed_total: int
    destroyed_total: int
    timed_out_total: int
    limits: SchedulerLimits


class Pong(Result):
    """The kernel's health and identity (kernel.ping): versions, the caller, the audit head."""

    pong: Literal[True]
    kernel_version: str
    api_version: int
    identity: CallerIdentity
    #: None: nothing committed yet, or the kernel keeps no audit log
    audit_head: AuditHead | None
    #: None: the kernel watches no memory (a kernel built for tests); absent when the
    #: call asked for no figures (``figures: false``)
    memory: KernelMemory | None = None
    #: None: the kernel runs no scheduler; absent when the call asked for no figures
    scheduler: KernelScheduler | None = None


# -- audit.flush -------------------------------------------------------------------------


class AuditFlushed(Result):
    """The audit entries held were committed (audit.flush)."""

    #: the newest durable entry's number (0: none yet)
    seq: int


# -- policy.get, policy.update -----------------------------------------------------------


class PolicyView(Result):
    """The policy in force and the project's extension rules (policy.get)."""

    #: the policy file (None: a kernel started without a project)
    path: str | None
    #: the file's text, or fluffy's defaults while the file does not exist
    text: str
    #: whether ``text`` is fluffy's defaults (no ``.fluffy/policy.yaml`` yet)
    default: bool
    #: rule name -> its text, as written in the project's ``.fluffy/rules/`` (open-ended:
    #: the names are the project's)
    rules: dict[str, str]
    #: why the rules cannot be read (``rules`` is then empty; None: they were read)
    rules_error: str | None


class PolicyUpdated(Result):
    """A policy update's plan, tried on the last audited decisions (policy.update)."""

    #: whether the plan was applied (only on ``approve: true`` from the CLI)
    applied: bool
    #: one line per decision the new policy makes differently
    changes: list[str]
    #: how many of ``changes`` remove or weaken a rule
    breaking: int
    #: more than five breaking changes: the confirmation phrase is needed
    needs_phrase: bool
    #: the phrase to send (None unless ``needs_phrase``)
    phrase: str | None
    #: decisions replayed
    trial_size: int
    #: of them, decisions made for the model's tool calls
    ai_trial_size: int
    #: of ``changes``, those to the model's tool calls
    ai_changes: int
    #: the names of the project's rules after the update (None: rules not changed)
    rules: list[str] | None


# -- project.info ------------------------------------------------------------------------


class NodeFacts(Part):
    """A JavaScript project's facts, as its files say them."""

    #: the package manager (npm, pnpm, yarn, ...)
    manager: str
    typescript: bool
    #: the test runner found (vitest, jest, ...)
    runner: str | None
    #: the package.json script that runs the tests
    test_script: str | None
    #: the Node major version asked for, e.g. "20"
    node: str | None
    #: the lock file the environment installs from (null: none, so no packages)
    lock: str | None = None


class ProjectLayout(Part):
    """The project's layout as the kernel detected it (paths relative, posix, ``.``: the root)."""

    kind: Literal["src", "flat", "modules", "empty", "node"]
    name: str | None
    source_roots: list[str]
    packages: list[str]
    test_roots: list[str]
    test_globs: list[str]
    source_globs: list[str]
    merge_globs: list[str]
    #: pytest's own ``pythonpath`` setting
    pythonpath: list[str]
    #: how each part was found
    notes: list[str]
    #: one line for people
    summary: str
    language: Literal["python", "javascript"]
    #: None: not a JavaScript project
    node: NodeFacts | None


class PolicySource(Part):
    """Where the policy in force comes from."""

    source: Literal["defaults", ".fluffy/policy.yaml"]
    default: bool


class ProjectEnvironment(Part):
    """The test environment test.run would use now, and what the user is told of it."""

    #: whether the project needs an environment image at all
    needed: bool
    #: the key the project's dependency files ask for (None: none needed)
    key: str | None
    #: whether the environment used matches that key
    current: bool
    #: the environment's image (None: none built)
    image: str | None
    #: packages installed in it
    packages: int
    project_installed: bool
    sources: list[str]
    warnings: list[str]
    #: lines of the project's files never fetched (URL, VCS, path, option), with file:line
    refused: list[str]
    built_from_source: list[str]
    note: str


class ProjectInfo(Result):
    """What the kernel applies to this project: the first-run block (project.info)."""

    #: the project's folder (None: a kernel started without a project)
    project: str | None
    layout: ProjectLayout | None
    policy: PolicySource
    #: whether the project has a ``.fluffy/`` folder
    initialised: bool
    #: None: no test environment can be chosen (no project, no image)
    environment: ProjectEnvironment | None


# -- plugin.install ----------------------------------------------------------------------


class PlannedTool(Part):
    """One tool a plugin to be installed declares."""

    name: str
    description: str
    #: the manifest's claim (shown to the user)
    read_only: bool


class PluginPlan(Part):
    """What the user is asked to approve: the plugin's manifest, files and warnings."""

    #: the folder the CLI sent it from
    source: str
    name: str
    version: str
    description: str
    author: str
    sandbox_template: Literal["code-executor", "integration-test"]
    #: syscalls the plugin asks for
    required_capabilities: list[str]
    #: the manifest's tags and ``third_party``, sorted
    tags: list[str]
    tools: list[PlannedTool]
    min_api_version: int
    #: how many files
    files: int
    total_bytes: int
    #: capabilities and tools the current policy would refuse
    warnings: list[str]
    #: the sha256 of the files (hex): an answer names it
    digest: str


class PluginInstalled(Result):
    """A plugin install's plan, or the user's approval of it (plugin.install)."""

    #: True only on ``approve: true`` (recorded first; the CLI installs after it)
    approved: bool
    plan: PluginPlan


# -- mcp.list, mcp.reload ----------------------------------------------------------------


class BreakerStatus(Part):
    """A circuit breaker (a plugin's or an MCP server's): its state, failures in a row,
    the last error."""

    #: the plugin's or the server's name
    name: str
    state: Literal["closed", "open", "half_open"]
    consecutive_failures: int
    #: seconds until an open circuit lets a trial call through (None unless open)
    retry_in_s: float | None
    trial_in_flight: bool
    #: one line, secrets redacted (None: no failure yet)
    last_error: str | None


class McpServerStatus(Part):
    """A registered MCP server, or (``error`` only) a record that could not be read."""

    name: str
    #: the rest is absent from a row of a record that could not be read:
    command: list[str] = []
    image: str = ""
    #: the tools' short names
    tools: list[str] = []
    allowed_hosts: list[str] = []
    running: bool = False
    sandbox_id: str | None = None
    #: how often it was started since the kernel started
    starts: int = 0
    circuit: BreakerStatus | None = None
    #: why the record could not be read (absent from a server's row)
    error: str = ""


class McpServerList(Result):
    """The project's MCP servers (mcp.list)."""

    servers: list[McpServerStatus]


class McpReloaded(Result):
    """The MCP servers after their records were read again (mcp.reload)."""

    servers: list[McpServerStatus]
    #: servers stopped because their record changed or went
    stopped: list[str]
    #: MCP tools offered now
    tools: int
