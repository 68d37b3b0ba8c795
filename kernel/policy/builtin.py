"""Built-in rules: hard-coded, evaluated first, at most ten (design: Built-in Rules).

Path confinement (``..``, absolute paths outside the project, symlink escapes) is done by
the engine before any rule runs.  These protect what the kernel itself depends on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fluffy.kernel.globs import GlobSet, literal_roots
from fluffy.kernel.policy.engine import READ_ONLY, BuiltinRule, EvalContext, Request, Verdict

MAX_BUILTINS = 10
POLICY_GLOBS = (
    ".fluffy/policy.yaml",
    ".fluffy/policy.yml",
    ".fluffy/policy.*.tmp",
    ".fluffy/rules/**",  # the extension rules: part of the policy
    ".fluffy/rules",  # ... and their folder (deleting it removes them all)
    ".fluffy/mcp/**",  # the MCP servers the kernel starts (ADR-046), and their folder
    ".fluffy/mcp",
    "/.fluffy",  # the folder that holds them all (exact: deleting or replacing it)
)
AUDIT_GLOBS = (".fluffy/audit.db", ".fluffy/audit.db-*", ".fluffy/backups/**")
STATE_GLOBS = (".fluffy/state.db", ".fluffy/state.db-*", ".fluffy/fluffy.db", ".fluffy/fluffy.db-*")


def _protect(name: str, globs: Sequence[str], why: str) -> BuiltinRule:
    spec = GlobSet(globs, lazy=True)  # fluffy's own globs: compiled at the first match
    roots = literal_roots(globs)  # a cheap first test: most paths are nowhere near these
    roots = None if roots is None else frozenset(root.lower() for root in roots)

    def rule(request: Request, ctx: EvalContext) -> Verdict | None:
        if ctx.path is None or request.syscall in READ_ONLY:
            return None
        path = ctx.path.lower()  # case-insensitive file systems: `.FLUFFY` is `.fluffy`
        if roots is not None and path.split("/", 1)[0] not in roots:
            return None
        if spec.match(path) or spec.match(ctx.path):
            return Verdict(f"builtin:{name}", "builtin", "deny", why)
        return None

    rule.__name__ = f"builtin:{name}"
    return rule


def meta_policy_update(request: Request, ctx: EvalContext) -> Verdict | None:
    if request.syscall == "policy.update":
        return Verdict(
            "builtin:meta-policy",
            "builtin",
            "require_review",
            "policy changes always need human review",
        )
    return None


def plugin_install_review(request: Request, ctx: EvalContext) -> Verdict | None:
    if request.syscall == "plugin.install":
        return Verdict(
            "builtin:plugin-install",
            "builtin",
            "require_review",
            "installing a third-party plugin always needs human review",
        )
    return None


def _inside(root: Path | None, folder: Path) -> list[str]:
    """``folder`` as a glob relative to the project, if the project contains it."""
    if root is None:
        return []
    try:
        relative = folder.resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return []
    return [f"{relative.as_posix()}/**"] if relative.parts else ["**"]


def default_builtins(
    root: Path | None = None,
    *,
    kernel_dir: Path | None = None,
    bootstrap_dir: Path | None = None,
) -> list[BuiltinRule]:
    """The built-in rules for a project (kernel/bootstrap dirs protected if inside it)."""
    from fluffy.paths import package_root

    kernel_dir = kernel_dir or package_root() / "kernel"
    bootstrap_dir = bootstrap_dir or package_root() / "bootstrap"
    rules: list[BuiltinRule] = [
        meta_policy_update,
        plugin_install_review,
        _protect(
            "policy-files",
            POLICY_GLOBS,
            "policy files change only through policy.update (with review)",
        ),
        _protect("audit-log", AUDIT_GLOBS, "the audit log is written by the kernel only"),
        _protect("state-db", STATE_GLOBS, "the state database is written by the kernel only"),
    ]
    kernel = _inside(root, kernel_dir)
    if kernel:
        rules.append(_protect("kernel-files", kernel, "the running kernel's own files"))
    bootstrap = _inside(root, bootstrap_dir)
    if bootstrap:
        rules.append(_protect("bootstrap-files", bootstrap, "the bootstrap's own files"))
    assert len(rules) <= MAX_BUILTINS
    return rules
