"""Policy evaluation (design: Rule Evaluation Engine, Policy Decision Types).

Order of evaluation is an optimisation, never semantics: built-in rules, then the token
fast path, then YAML rules (indexed by syscall), then extension rules.  A deny anywhere
is terminal; require_review beats allow; allow needs at least one rule and no deny;
nothing allowed means deny.  A rule that fails while being evaluated counts as deny.
Every decision lists the rules that matched and the one that decided.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Literal

import msgspec

from fluffy.kernel.globs import GlobSet, literal_roots
from fluffy.kernel.policy.argv import matches as argv_matches
from fluffy.kernel.policy.argv import parse_pattern, shown
from fluffy.kernel.policy.model import Match, PolicyFile, Rule
from fluffy.kernel.policy.request_paths import PathEscape, normalize
from fluffy.kernel.policy.tokens import TokenStore, TokenUse

Result = Literal["allow", "deny", "require_review"]
Vote = Literal["allow", "deny", "require_review", "pass"]

#: Syscalls that only read; every other syscall with a path may change something.
READ_ONLY = frozenset({"fs.read", "fs.list", "fs.exists", "search.grep", "search.glob"})


class Caller(msgspec.Struct, frozen=True):
    name: str
    tags: frozenset[str] = frozenset()
    container_id: str | None = None
    connection: str | None = None


class Request(msgspec.Struct, frozen=True):
    syscall: str
    caller: Caller
    path: str | None = None
    state: str = "idle"
    mode: str = "strict"
    size: int | None = None
    sandbox: str | None = None
    token: TokenUse | None = None
    #: The check before a capability token is issued for this operation (it will run in
    #: a sandbox, whose every use of it is checked against the token): a rule's
    #: ``require_capability_token`` is met by the token to come.
    issuing: bool = False
    #: The command a ``container.run`` would run (its argv), for rules' ``command``.
    command: tuple[str, ...] | None = None


class Verdict(msgspec.Struct, frozen=True):
    """One rule's vote on one request."""

    rule: str
    layer: Literal["builtin", "yaml", "extension"]
    vote: Vote
    reason: str = ""
    failed: bool = False  # the rule raised (or its sandbox failed): it votes deny, audited


class Decision(msgspec.Struct):
    result: Result
    reasons: list[str]
    matched: list[Verdict] = msgspec.field(default_factory=list)
    decided_by: str | None = None
    by_token: bool = False
    path: str | None = None

    @property
    def audit_decision(self) -> str:
        """The audit log's policy_decision value."""
        if self.result == "allow":
            return "allowed_by_token" if self.by_token else "allowed"
        return "denied" if self.result == "deny" else "review_required"


BuiltinRule = Callable[[Request, "EvalContext"], Verdict | None]
ExtensionRule = Callable[[Request], Iterable[Verdict]]


class EvalContext(msgspec.Struct):
    now: float  # the one time snapshot of this evaluation (no TOCTOU on expiry)
    path: str | None
    root: Path | None


class CompiledRule:
    """A YAML rule with its globs compiled once, at load."""

    __slots__ = ("except_", "match", "rule", "syscalls")

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.match = _CompiledMatch(rule.match)
        self.except_ = [_CompiledMatch(m) for m in rule.except_]
        self.syscalls = tuple(rule.match.syscall or ())

    def vote(self, request: Request, path: str | None) -> Verdict | None:
        if not self.match.matches(request, path):
            return None
        name = self.rule.name
        if any(e.matches(request, path) for e in self.except_):
            return Verdict(name, "yaml", "pass", "an except condition matched")
        reason = self.rule.reason or f"rule {name}"
        if self.rule.action == "allow" and self.rule.constraints is not None:
            broken = _broken_constraint(self.rule, request)
            if broken:
                return Verdict(name, "yaml", "deny", broken)
        return Verdict(name, "yaml", self.rule.action, reason)


class _RuleIndex:
    """Rules of one syscall, indexed by the first path segment their globs can match.

    Rules whose globs may match anywhere (or that have no path condition) are always
    candidates; a rule anchored to ``src/`` is looked at only for paths under ``src``.
    The index only narrows which rules are looked at; decisions are the same.
    """

    __slots__ = ("always", "by_root")

    def __init__(self) -> None:
        self.always: list[CompiledRule] = []
        self.by_root: dict[str, list[CompiledRule]] = {}

    def add(self, compiled: CompiledRule) -> None:
        globs = compiled.rule.match.path_glob
        if globs == []:
            return  # matches no path: never a candidate (design, case 25)
        roots = literal_roots(globs) if globs else None
        if roots is None:
            self.always.append(compiled)
            return
        for root in roots:
            self.by_root.setdefault(root, []).append(compiled)

    def candidates(self, path: str | None) -> list[CompiledRule]:
        if path is None or not self.by_root:
            return self.always
        return self.always + self.by_root.get(path.split("/", 1)[0], [])


class _CompiledMatch:
    __slots__ = ("commands", "exact", "fields", "prefixes", "spec")

    def __init__(self, match: Match) -> None:
        self.fields = match
        # lazy: the globs were checked when the policy was read (Match, check_globs);
        # compiling waits for the first request this rule is looked at for
        globs = match.path_glob
        self.spec = GlobSet(globs, lazy=True) if globs is not None else None
        names = match.syscall or ()
        # "mcp.time.*" names every syscall under mcp.time. (ADR-046)
        self.exact = frozenset(n for n in names if not n.endswith("*"))
        self.prefixes = tuple(n[:-1] for n in names if n.endswith("*"))
        self.commands = (
            tuple(parse_pattern(p) for p in match.command) if match.command is not None else None
        )

    def matches(self, request: Request, path: str | None) -> bool:
        m = self.fields
        if (
            m.syscall is not None
            and request.syscall not in self.exact
            and not request.syscall.startswith(self.prefixes)
        ):
            return False
        # An empty path_glob list matches no path at all (design, case 25).
        if self.spec is not None and (path is None or not self.spec.match(path)):
            return False
        if m.caller_tag is not None and not request.caller.tags.intersection(m.caller_tag):
            return False
        if m.plugin is not None and request.caller.name not in m.plugin:
            return False
        if m.state_machine_state is not None and request.state not in m.state_machine_state:
            return False
        if self.commands is not None and (
            request.command is None
            or not any(argv_matches(p, request.command) for p in self.commands)
        ):
            return False
        return m.session_mode is None or request.mode in m.session_mode


def _broken_constraint(rule: Rule, request: Request) -> str:
    c = rule.constraints
    assert c is not None
    if c.require_capability_token and not request.issuing:
        return f"rule {rule.name} allows this only with a capability token"
    if c.require_sandbox is not None and not sandbox_satisfies(c.require_sandbox, request.sandbox):
        return (
            f"rule {rule.name} requires the operation to run in {c.require_sandbox}, "
            f"not in {request.sandbox or 'no sandbox'}"
        )
    limit = c.max_file_bytes
    if limit is not None and (request.size is None or request.size > limit):
        asked = "an unknown size" if request.size is None else f"{request.size} bytes"
        return f"rule {rule.name} allows at most {c.max_file_size} ({asked} asked)"
    return ""


#: Syscalls of MCP servers' tools (mcp.SERVER.TOOL): unmatched, they need review.
MCP_PREFIX = "mcp."
#: A command the model asks to run in a sandbox (debug mode): unmatched, it needs review.
COMMAND_SYSCALL = "container.run"

#: The L2 sandbox templates (design: Sandbox Templates).
L2_TEMPLATES = frozenset(
    {"ai-provider", "code-executor", "policy-sandbox", "integration-test", "mcp-server"}
)


def sandbox_satisfies(required: str, actual: str | None) -> bool:
    """``L2`` is met by any L2 template; a template name only by that template."""
    if actual is None:
        return False
    if required == "L2":
        return actual in L2_TEMPLATES
    return actual == required


class PolicyEngine:
    def __init__(
        self,
        policy: PolicyFile,
        *,
        builtins: Sequence[BuiltinRule] = (),
        extensions: Sequence[ExtensionRule] = (),
        tokens: TokenStore | None = None,
        root: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.builtins = list(builtins)
        self.extensions = list(extensions)
        self.tokens = tokens or TokenStore()
        self.root = root
        self.clock = clock
        self.by_syscall: dict[str, _RuleIndex] = {}
        self.any_syscall = _RuleIndex()
        for rule in policy.capabilities:
            compiled = CompiledRule(rule)
            if compiled.syscalls and not any(n.endswith("*") for n in compiled.syscalls):
                for syscall in compiled.syscalls:
                    self.by_syscall.setdefault(syscall, _RuleIndex()).add(compiled)
            else:
                self.any_syscall.add(compiled)

    def with_policy(
        self, policy: PolicyFile, extensions: Sequence[ExtensionRule] | None = None
    ) -> PolicyEngine:
        """A new engine for ``policy`` sharing this one's built-ins, tokens, root and clock,
        and its extension rules unless others are given (a policy change swaps rules,
        nothing else)."""
        return PolicyEngine(
            policy,
            builtins=self.builtins,
            extensions=self.extensions if extensions is None else extensions,
            tokens=self.tokens,
            root=self.root,
            clock=self.clock,
        )

    def evaluate(self, request: Request) -> Decision:
        ctx = EvalContext(now=self.clock(), path=None, root=self.root)
        if request.path is not None:
            try:
                ctx.path = normalize(request.path, self.root)
            except PathEscape as escape:
                verdict = Verdict("builtin:path-confinement", "builtin", "deny", str(escape))
                return Decision("deny", [str(escape)], [verdict], verdict.rule)
        matched: list[Verdict] = []
        reviews: list[str] = []
        allowed = False

        def take(verdict: Verdict | None) -> Decision | None:
            nonlocal allowed
            if verdict is None:
                return None
            matched.append(verdict)
            if verdict.vote == "deny":
                return Decision("deny", [verdict.reason], matched, verdict.rule, path=ctx.path)
            if verdict.vote == "require_review":
                reviews.append(verdict.reason)
            elif verdict.vote == "allow":
                allowed = True
            return None

        for builtin in self.builtins:
            denied = take(_guarded(functools.partial(builtin, request, ctx), builtin, "builtin"))
            if denied:
                return denied

        if request.token is not None:
            problem = self.tokens.check(
                request.token,
                container_id=request.caller.container_id,
                connection=request.caller.connection,
                syscall=request.syscall,
                path=ctx.path,
                now=ctx.now,
            )
            if problem is None:
                if reviews:
                    return Decision("require_review", reviews, matched, None, True, ctx.path)
                return Decision(
                    "allow", ["valid capability token"], matched, "token", True, ctx.path
                )

        index = self.by_syscall.get(request.syscall)
        candidates = (
            *(index.candidates(ctx.path) if index is not None else ()),
            *self.any_syscall.candidates(ctx.path),
        )
        for compiled in candidates:
            vote = functools.partial(compiled.vote, request, ctx.path)
            denied = take(_guarded(vote, compiled, "yaml"))
            if denied:
                return denied

        ext_request = (
            msgspec.structs.replace(request, path=ctx.path, token=None)
            if self.extensions
            else request
        )
        for extension in self.extensions:
            try:
                verdicts = list(extension(ext_request))
            except Exception as exc:
                verdicts = [
                    Verdict(
                        _name(extension),
                        "extension",
                        "deny",
                        f"extension rule failed: {type(exc).__name__}: {exc}",
                        failed=True,
                    )
                ]
            for verdict in verdicts:
                denied = take(verdict)
                if denied:
                    return denied

        if reviews:
            return Decision("require_review", reviews, matched, None, path=ctx.path)
        if allowed:
            deciders = [v.rule for v in matched if v.vote == "allow"]
            return Decision(
                "allow", [f"allowed by {', '.join(deciders)}"], matched, deciders[0], path=ctx.path
            )
        if request.syscall.startswith(MCP_PREFIX):
            # an MCP server's tool no rule speaks of: the user decides (ADR-046)
            return Decision(
                "require_review",
                [f"no rule allows {request.syscall}: MCP tools ask the user first"],
                matched,
                None,
                path=ctx.path,
            )
        if request.syscall == COMMAND_SYSCALL:
            # a command no rule speaks of: the person decides, each time (ADR-062)
            said = f" `{shown(request.command)}`" if request.command is not None else ""
            return Decision(
                "require_review",
                [f"no rule allows the command{said}: commands the model runs ask the person"],
                matched,
                None,
                path=ctx.path,
            )
        return Decision(
            "deny", ["no rule explicitly allowed this operation"], matched, None, path=ctx.path
        )


def _name(thing: object) -> str:
    rule = getattr(thing, "rule", None)
    if isinstance(rule, Rule):
        return rule.name
    return str(getattr(thing, "__name__", type(thing).__name__))


def _guarded(
    call: Callable[[], Verdict | None], owner: object, layer: Literal["builtin", "yaml"]
) -> Verdict | None:
    try:
        return call()
    except Exception as exc:
        reason = f"rule failed: {type(exc).__name__}: {exc}"
        return Verdict(_name(owner), layer, "deny", reason, failed=True)
