"""fluffy's default policy, fitted to a project's layout, as a commented YAML file.

A project without ``.fluffy/policy.yaml`` gets exactly this policy (the kernel parses the
same text it would write), and ``fluffy init`` writes it out for the user to edit.  Only
the starting point is fitted: strict TDD, reviews of sensitive files and default deny are
the same for every project; the globs say where this project keeps its tests and code,
and so what merges without review (``merge:``).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path

from fluffy.kernel.confined_files import DEFAULT_SENSITIVE
from fluffy.kernel.policy.model import PolicyFile, load_policy, parse_policy
from fluffy.kernel.project.layout import Layout, detect_layout

READS = (
    "fs.read",
    "fs.list",
    "fs.exists",
    "search.grep",
    "search.glob",
    "git.status",
    "git.diff",
)
WRITES = ("fs.write", "fs.edit", "fs.delete")
#: Where ``fluffy init`` writes the policy, relative to the project.
POLICY_FILE = ".fluffy/policy.yaml"


def _said(text: str, limit: int = 240) -> str:
    """Text read from the repository (its name, its folders' names, its test script), as
    it can stand in a YAML comment: on one line, every character that is not printable
    (a newline, a YAML line break such as U+2028, a control) written as an escape, so
    no repository can add a key to the policy by naming itself ``"x\\ntools: ..."``."""
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _flow(items: Sequence[str]) -> str:
    """A YAML flow list of quoted strings (JSON strings are valid YAML scalars)."""
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def _wrap(items: Sequence[str], indent: int, width: int = 96) -> str:
    """A flow list broken over lines for reading."""
    lines: list[str] = []
    line = ""
    for item in (json.dumps(i) for i in items):
        piece = item if not line else f"{line}, {item}"
        if len(piece) + indent > width and line:
            lines.append(line + ",")
            line = item
        else:
            line = piece
    lines.append(line)
    pad = " " * indent
    return "[" + f"\n{pad} ".join(lines) + "]"


def render_policy(layout: Layout, *, header: str = "") -> str:
    """The default policy for ``layout`` as commented YAML (parses to the same rules)."""
    notes = "".join(f"#   - {_said(note)}\n" for note in layout.notes)
    sensitive = _wrap(DEFAULT_SENSITIVE, 17)
    merged = textwrap.fill(
        "  ".join(_said(glob) for glob in layout.merge_globs),
        92,
        initial_indent="#   ",
        subsequent_indent="#   ",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return f"""\
# fluffy's policy for this project{f" ({_said(layout.name)})" if layout.name else ""}.
{header}#
# Default deny: a tool call that no rule below allows is refused.  Deny beats allow, and
# require_review beats allow.  Globs follow .gitignore (`**` is any number of folders).
# Sizes: KiB/MiB/GiB, KB/MB/GB; times: s/ms/m/h.  While a kernel runs, change this file
# with `fluffy config policy edit`: the new rules are validated, tried against the last
# 100 decisions, shown to you for review, and audited.  The model can never write it.
#
# Layout fluffy found: {_said(layout.describe(), 400)}
{notes}capabilities:
  # Reading the project is always allowed (files, folders, search, git status and diff).
  - name: read-project
    match: {{syscall: {_flow(READS)}}}
    action: allow

  # Strict TDD: plan, then tests, then code.  plan.complete ends the planning.
  - name: finish-planning
    match: {{syscall: plan.complete, state_machine_state: [planning]}}
    action: allow

  # Modes are yours to switch (--mode, /explore, /debug): strict always works; debug also
  # asks you each time (at the terminal, or --yes in a one-shot run).  The model cannot;
  # it may ask you while planning (workflow.request_mode), and your yes switches.
  - name: person-switches-modes
    match: {{syscall: session.set_mode, caller_tag: [person]}}
    action: allow

  # The AI may *ask* for a TDD exemption, for tests before a merge or for another mode;
  # you decide each one.
  - name: ask-the-user
    match: {{syscall: [workflow.request_exemption, workflow.add_tests, workflow.request_mode]}}
    action: allow

  # Tests are written first, where this project keeps them.
  - name: write-tests-while-test-writing
    match:
      syscall: {_flow(WRITES)}
      path_glob: {_flow(layout.test_globs)}
      state_machine_state: [test_writing, retroactive_testing]
    action: allow
    constraints: {{require_sandbox: L2, max_file_size: "100KiB"}}

  # Then the code, after a test has failed (red) -- where this project keeps its code.
  - name: write-source-while-code-writing
    match:
      syscall: {_flow(WRITES)}
      path_glob: {_flow(layout.source_globs)}
      state_machine_state: [code_writing]
    action: allow
    constraints: {{require_sandbox: L2, max_file_size: "100KiB"}}

  # Explore and debug modes (when you switch to them) write anywhere but .fluffy/ and .git/.
  - name: explore-writes
    match:
      syscall: {_flow(WRITES)}
      session_mode: [explore, debug]
      state_machine_state: [exploring]
    action: allow
    constraints: {{require_sandbox: L2, max_file_size: "100KiB"}}

  # Secrets, dependency files and files your machine runs (CI, hooks, editor and
  # container settings, build scripts) always wait for your review, in every mode.
  - name: sensitive-files
    match:
      syscall: {_flow(WRITES)}
      path_glob: {sensitive}
    action: require_review
    reason: "Sensitive file modification requires review"

  # Tests run in a sandbox with no network.
  - name: run-tests
    match: {{syscall: test.run}}
    action: allow
    constraints: {{require_sandbox: code-executor}}

  # Debug mode (--mode debug, /debug): the model may run a command in a sandbox
  # (container.run: the project read-only, no network, a time-out).  No rule here allows
  # one, so each command asks you first.  A rule allows the commands you trust, e.g.
  #   - name: run-my-module
  #     match: {{syscall: container.run, command: ["python -m mypkg **"]}}
  #     action: allow
  # (each word a glob for one argument; a last ** is any further arguments).

  # A commit is made only after the merge was approved (automatically or by you).
  - name: commit-after-review
    match: {{syscall: git.commit, state_machine_state: [committing]}}
    action: allow

  # Plugins you install yourself write only after your review.
  - name: third-party-writes-need-review
    match: {{syscall: {_flow(WRITES)}, caller_tag: [third_party]}}
    action: require_review
    reason: "Third-party plugins' writes are reviewed"
    except:
      - {{caller_tag: [trusted_write]}}

# What merges without your review, in every mode: changes where this project keeps its
# code and tests, as found above, and the paths listed below:
{merged}
# Anything else -- dotfiles and dot-folders, configuration at the top, new files outside
# those folders -- waits for you, even with --yes: a tool on your machine may read it as
# configuration.  Sensitive files always wait.
merge:
  auto_merge_paths: []  # e.g. ["docs/**/*.md"]
"""


def default_policy_text(project: Path) -> str:
    """The policy fluffy applies to ``project`` while it has no ``.fluffy/policy.yaml``."""
    return render_policy(
        detect_layout(project),
        header="# fluffy applies these defaults while the file does not exist; "
        "`fluffy init` writes it.\n",
    )


def project_policy(project: Path | None) -> tuple[PolicyFile, str | None]:
    """The project's ``.fluffy/policy.yaml`` (errors block start-up), or while it does not
    exist fluffy's default policy fitted to the project's layout (and its text).  Without
    a project: no rules (default deny)."""
    if project is None:
        return PolicyFile(), None
    if (project / ".fluffy" / "policy.yaml").is_file():
        return load_policy(project / ".fluffy" / "policy.yaml"), None
    text = default_policy_text(project)
    return parse_policy(text, "<fluffy's default policy>"), text
