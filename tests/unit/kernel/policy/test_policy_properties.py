"""Differential and property tests: the real engine against the reference evaluator."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fluffy.kernel.policy.engine import Caller, PolicyEngine, Request
from fluffy.kernel.policy.model import Constraints, Match, PolicyFile, Rule
from unit.policy_reference import reference_decision

SYSCALLS = ["fs.write", "fs.read", "test.run", "git.commit", "container.run"]
GLOBS = ["src/**", "tests/**", "*.py", "*.md", "docs/", "!src/keep.py", "src/*/x.py", "**/gen/**"]
PATHS = [
    "src/a.py",
    "src/keep.py",
    "src/m/x.py",
    "tests/t.py",
    "docs/r.md",
    "a/gen/b.txt",
    "README.md",
    "setup.py",
]
TAGS = ["core_plugin", "trusted_write", "third_party"]
COMMANDS = ["python -m pkg **", "python -m pkg", "pytest *", "sh -c **", "py*", "'a b' c"]
ARGVS = [("python", "-m", "pkg"), ("python", "-m", "pkg", "-v"), ("pytest", "-x"),
         ("pytest", "-x", "t"), ("sh", "-c", "ls; id"), ("a b", "c"), ("python3",)]  # fmt: skip
STATES = ["idle", "planning", "test_writing", "code_writing"]


def opt_list(items: list[str], max_size: int = 2) -> st.SearchStrategy[list[str] | None]:
    return st.none() | st.lists(st.sampled_from(items), min_size=1, max_size=max_size, unique=True)


matches = st.builds(
    Match,
    syscall=opt_list(SYSCALLS),
    path_glob=opt_list(GLOBS, 3),
    caller_tag=opt_list(TAGS),
    plugin=opt_list(["tool", "git-tool"]),
    state_machine_state=opt_list(STATES),
    session_mode=st.none()
    | st.lists(
        st.sampled_from(["strict", "explore", "debug"]), min_size=1, max_size=2, unique=True
    ),
    command=opt_list(COMMANDS),
)
constraints = st.none() | st.builds(
    Constraints,
    require_sandbox=st.none() | st.sampled_from(["L2", "code-executor"]),
    require_capability_token=st.booleans(),
    max_file_size=st.none() | st.sampled_from(["100", "1KiB", "1MB"]),
)
rules = st.builds(
    Rule,
    name=st.uuids().map(str),
    match=matches,
    action=st.sampled_from(["allow", "deny", "require_review", "pass"]),
    reason=st.none() | st.text(max_size=10),
    except_=st.lists(matches, max_size=2),
    constraints=constraints,
)
policies = st.lists(rules, max_size=8).map(lambda r: PolicyFile(capabilities=r))
requests = st.builds(
    Request,
    syscall=st.sampled_from([*SYSCALLS, "unknown.call"]),
    caller=st.builds(
        Caller,
        name=st.sampled_from(["tool", "git-tool"]),
        tags=st.frozensets(st.sampled_from(TAGS), max_size=2),
    ),
    path=st.none() | st.sampled_from(PATHS),
    state=st.sampled_from(STATES),
    mode=st.sampled_from(["strict", "explore", "debug"]),
    size=st.none() | st.sampled_from([10, 2000, 5_000_000]),
    sandbox=st.none() | st.sampled_from(["code-executor", "ai-provider", "L1"]),
    command=st.none() | st.sampled_from(ARGVS),
)

RANK = {"allow": 0, "require_review": 1, "deny": 2}


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(policies, requests)
def test_engine_agrees_with_the_reference(policy: PolicyFile, request: Request) -> None:
    got = PolicyEngine(policy).evaluate(request)
    assert got.result == reference_decision(policy, request, request.path)


@settings(max_examples=300)
@given(policies, requests, st.randoms())
def test_rule_order_never_changes_the_decision(
    policy: PolicyFile, request: Request, rnd: random.Random
) -> None:
    shuffled = list(policy.capabilities)
    rnd.shuffle(shuffled)
    a = PolicyEngine(policy).evaluate(request).result
    b = PolicyEngine(PolicyFile(capabilities=shuffled)).evaluate(request).result
    assert a == b


@settings(max_examples=300)
@given(policies, requests, matches)
def test_adding_a_deny_never_produces_an_allow(
    policy: PolicyFile, request: Request, match: Match
) -> None:
    before = PolicyEngine(policy).evaluate(request).result
    deny = Rule(name="added-deny", match=match, action="deny")
    after = PolicyEngine(PolicyFile(capabilities=[*policy.capabilities, deny])).evaluate(request)
    assert RANK[after.result] >= RANK[before]


@settings(max_examples=300)
@given(policies, requests, matches)
def test_require_review_is_never_weaker_than_allow(
    policy: PolicyFile, request: Request, match: Match
) -> None:
    allow = Rule(name="x", match=match, action="allow")
    review = Rule(name="x", match=match, action="require_review")
    with_allow = PolicyEngine(PolicyFile(capabilities=[*policy.capabilities, allow]))
    with_review = PolicyEngine(PolicyFile(capabilities=[*policy.capabilities, review]))
    assert RANK[with_review.evaluate(request).result] >= RANK[with_allow.evaluate(request).result]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_glob_matching_agrees_with_git_check_ignore(tmp_path: Path) -> None:
    from fluffy.kernel.globs import GlobSet

    # Trees as projects have them: folders named like folders, files like files.  (Git's
    # per-level evaluation differs from pathspec when a folder is named like a file and a
    # negation names that folder; fluffy documents that corner instead of guessing.)
    rng = random.Random(7)
    folders = ["src", "tests", "docs", "gen", "a", "b"]
    files = ["x.py", "y.md", "keep.py", "z.txt", "docs", "gen"]
    paths = sorted(
        {
            "/".join([*(rng.choice(folders) for _ in range(rng.randint(0, 3))), rng.choice(files)])
            for _ in range(400)
        }
    )
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    # Inclusions follow git exactly; exclusions here do not fight a folder exclusion (where
    # fluffy lets the exclusion win, git would not: see the next test).
    for globs in (
        [g for g in GLOBS if not g.startswith("!")],
        ["*.py", "!keep.py"],
        ["src/**", "docs/"],
        ["**/gen/", "docs", "src/*/x.py"],
    ):
        (tmp_path / ".gitignore").write_text("\n".join(globs) + "\n")
        proc = subprocess.run(
            ["git", "-C", str(tmp_path), "check-ignore", "--no-index", "--stdin"],
            input="\n".join(paths) + "\n",
            capture_output=True,
            text=True,
        )
        git_ignored = set(proc.stdout.split())
        spec = GlobSet(globs)
        ours = {p for p in paths if spec.match(p)}
        assert ours == git_ignored, (globs, sorted(ours ^ git_ignored)[:10])


@settings(max_examples=300)
@given(st.lists(st.sampled_from(GLOBS), min_size=1, max_size=5), st.sampled_from(PATHS))
def test_an_exclusion_always_wins_wherever_it_stands(globs: list[str], path: str) -> None:
    from fluffy.kernel.globs import GlobSet

    excluded = GlobSet([g[1:] for g in globs if g.startswith("!")] or ["/nothing-at-all"])
    if excluded.match(path):
        assert not GlobSet(globs).match(path)
        assert not GlobSet(list(reversed(globs))).match(path)


@settings(max_examples=200)
@given(st.lists(st.sampled_from(GLOBS), min_size=1, max_size=5), st.sampled_from(PATHS))
def test_a_set_compiled_at_its_first_match_matches_as_one_compiled_at_once(
    globs: list[str], path: str
) -> None:
    from fluffy.kernel.globs import GlobSet

    assert GlobSet(globs, lazy=True).match(path) == GlobSet(globs).match(path)


def test_only_a_lazy_set_defers_an_invalid_pattern_s_error() -> None:
    from pathspec.patterns.gitignore import GitIgnorePatternError

    from fluffy.kernel.globs import GlobSet

    with pytest.raises(GitIgnorePatternError):
        GlobSet(["src/**", "\\"])
    later = GlobSet(["src/**", "\\"], lazy=True)  # nothing compiled yet
    with pytest.raises(GitIgnorePatternError):
        later.match("src/a.py")
