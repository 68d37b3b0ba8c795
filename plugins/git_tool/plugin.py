"""The git tool plugin: ``git.status``, ``git.diff`` and ``git.commit`` on the project.

``git.commit`` builds the commit without writing the (read-only) project: a temporary
index (``/output/<call>/git-index``) and object folder (``/output/<call>/git-objects``,
with the project's objects as an alternate) receive everything git writes.  The result
names the commit, its parent and the branch ref to move; the kernel imports the objects
and updates the ref when it merges.
"""

from __future__ import annotations

import hashlib
import shutil
from typing import Any

from fluffy.errors import ToolFailed, ToolInputInvalid
from fluffy.plugins.git_tool.gitcmd import git, optional, parse_status, require_repository
from fluffy.plugins.git_tool.landing import (
    KEEP,
    REGULAR,
    Blobs,
    Entry,
    Landing,
    carry_all,
    kept_note,
    person_entry,
)
from fluffy.plugins.sdk import Handler, ToolContext, ToolDefinition, ToolPlugin, normalise_path

MAX_DIFF_CHARS = 1024 * 1024
MAX_STATUS_ENTRIES = 10000
OBJECTS, INDEX, PERSON_INDEX = "git-objects", "git-index", "person-index"

STATUS = ToolDefinition(
    name="git.status",
    description="The project's branch and changed files (git status, untracked files "
    "included). Shows the project itself, not this session's staged changes.",
    input_schema={"type": "object", "properties": {}, "additionalProperties": False},
    read_only=True,
    timeout_s=60,
)
DIFF = ToolDefinition(
    name="git.diff",
    description="The project's uncommitted changes as a unified diff (git diff), or the "
    "changes staged in git's index with cached=true; optionally limited to paths.",
    input_schema={
        "type": "object",
        "properties": {
            "paths": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": 4096},
                "maxItems": 1000,
            },
            "cached": {"type": "boolean", "default": False},
        },
        "additionalProperties": False,
    },
    read_only=True,
    truncation="head",
    timeout_s=60,
)
COMMIT = ToolDefinition(
    name="git.commit",
    description="Commit what this session merged since its last commit (only those files; "
    "nothing else of the working tree) on the current branch, as the person. The commit "
    "is prepared in the sandbox; the kernel applies it.",
    input_schema={
        "type": "object",
        "properties": {
            "message": {"type": "string", "minLength": 1, "maxLength": 20000},
        },
        "required": ["message"],
        "additionalProperties": False,
    },
    timeout_s=300,
)


def private_index(ctx: ToolContext) -> dict[str, str]:
    """A copy of the project's index for this call: git may refresh its stat data."""
    copy = ctx.call_dir / "git-index-copy"
    original = ctx.workspace / ".git" / "index"
    if original.is_file():
        shutil.copyfile(original, copy)
    return {"GIT_INDEX_FILE": str(copy)}


def status(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    require_repository(ctx)
    env = private_index(ctx)
    command = ("status", "--porcelain=v1", "-z", "--untracked-files=all")
    output = git(ctx, *command, env=env).stdout
    entries = parse_status(output)
    return {
        "branch": optional(ctx, "symbolic-ref", "--short", "-q", "HEAD"),
        "head": optional(ctx, "rev-parse", "-q", "--verify", "HEAD^{commit}"),
        "entries": entries[:MAX_STATUS_ENTRIES],
        "truncated": len(entries) > MAX_STATUS_ENTRIES,
        "clean": not entries,
    }


def diff(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    require_repository(ctx)
    paths = [normalise_path(p, allow_root=True, what="paths[]") for p in args.get("paths", [])]
    command = ["diff", "--no-color", "--no-ext-diff", "--no-textconv"]
    command += ["--src-prefix=a/", "--dst-prefix=b/"]
    if args["cached"]:
        command.append("--cached")
    text = git(ctx, *command, "--", *paths, env=private_index(ctx)).stdout
    return {"diff": text[:MAX_DIFF_CHARS], "truncated": len(text) > MAX_DIFF_CHARS}


def _order(ctx: ToolContext) -> dict[str, Any]:
    """The kernel's order for this commit: which paths (merged by the session, with the
    sha256 of their content, None for a removal), as whom, and the message."""
    order = ctx.settings.get("commit")
    if not isinstance(order, dict) or not isinstance(order.get("paths"), dict):
        raise ToolFailed(
            "git.commit has no list of merged paths from the kernel",
            why="the AI's commit holds only what the session merged",
            fix="Commit from a session after a merge.",
        )
    given = order.get("author")
    author: dict[str, Any] = given if isinstance(given, dict) else {}
    for value in (author.get("name"), author.get("email")):
        if not isinstance(value, str) or any(char in value for char in "<>\n\r\0"):
            raise ToolInputInvalid("the commit's author is not a name and an e-mail address")
    return order


def _mode(ctx: ToolContext, head: Entry | None, rel: str) -> str:
    """The path's mode: HEAD's, else the file's exec bit in the project, else 100644."""
    if head is not None and head.mode in REGULAR:
        return head.mode
    try:
        executable = (ctx.workspace / rel).stat().st_mode & 0o111
    except OSError:
        executable = 0
    return "100755" if executable else "100644"


def _apply(ctx: ToolContext, blobs: Blobs, landing: Landing, person: str) -> None:
    """Put each path's carried content into the commit's index, and into the person's
    where they held HEAD's version (their own staged version is carried or kept)."""
    index = {"GIT_INDEX_FILE": person}
    theirs = blobs.entries(None, sorted(landing.contents), index)
    written = {rel: data for rel, data in sorted(landing.contents.items()) if data is not None}
    blob = dict(zip(written, blobs.store_all(list(written.values())), strict=True))
    ours: dict[str, Entry | None] = {}
    persons: dict[str, Entry | None] = {}
    for rel in sorted(landing.contents):
        mode = _mode(ctx, landing.heads[rel], rel)
        new = ours[rel] = Entry(mode, blob[rel]) if rel in blob else None
        entry = person_entry(blobs, landing, rel, new, theirs.get(rel))
        if entry == KEEP:
            landing.notes.append(kept_note(rel))
        else:
            persons[rel] = entry
    _put(ctx, blobs.env, ours)
    _put(ctx, {**blobs.env, **index}, persons)


def _put(ctx: ToolContext, env: dict[str, str], entries: dict[str, Entry | None]) -> None:
    """Set (or, None, remove) each path's entry in the index ``env`` names, in one call."""
    if not entries:
        return
    removed = "0 " + "0" * 40
    lines = (
        f"{removed if e is None else f'{e.mode} {e.sha1}'}\t{rel}\0" for rel, e in entries.items()
    )
    git(ctx, "update-index", "-z", "--index-info", env=env, input="".join(lines))


def commit(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """HEAD's tree plus the session's own changes to the paths it merged (never `git add
    -A`, never the person's uncommitted lines: landing.py), as the person; the person's
    index is updated for those paths only (the kernel swaps it in only if nobody changed
    it meanwhile).  No commit (``commit: None``) when nothing is left to commit."""
    require_repository(ctx)
    order = _order(ctx)
    objects = ctx.call_dir / OBJECTS
    for folder in (objects / "info", objects / "pack"):
        folder.mkdir(parents=True, exist_ok=True)
    author = order["author"]
    env = {
        "GIT_INDEX_FILE": str(ctx.call_dir / INDEX),
        "GIT_OBJECT_DIRECTORY": str(objects),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(ctx.workspace / ".git" / "objects"),
        "GIT_AUTHOR_NAME": author["name"],
        "GIT_AUTHOR_EMAIL": author["email"],
        "GIT_COMMITTER_NAME": author["name"],
        "GIT_COMMITTER_EMAIL": author["email"],
    }
    parent = optional(ctx, "rev-parse", "-q", "--verify", "HEAD^{commit}", env=env)
    ref = optional(ctx, "symbolic-ref", "-q", "HEAD", env=env)
    if parent is not None:
        git(ctx, "read-tree", parent, env=env)
    person = ctx.call_dir / PERSON_INDEX
    original = ctx.workspace / ".git" / "index"
    base = None
    if original.is_file() and not original.is_symlink():
        data = original.read_bytes()
        base = hashlib.sha256(data).hexdigest()
        person.write_bytes(data)
    elif parent is not None:
        git(ctx, "read-tree", parent, env={**env, "GIT_INDEX_FILE": str(person)})
    blobs = Blobs(ctx, env)
    landing = carry_all(blobs, order, parent)
    _apply(ctx, blobs, landing, str(person))
    tree = git(ctx, "write-tree", env=env).stdout.strip()
    if parent is not None:
        before = git(ctx, "rev-parse", f"{parent}^{{tree}}", env=env).stdout.strip()
    else:
        before = git(ctx, "hash-object", "-t", "tree", "--stdin", env=env, input="").stdout.strip()
    if tree == before:  # every change overlaps the person's lines, or HEAD has it
        if not landing.left_out:
            landing.notes.append(
                "nothing was committed: "
                + (f"the last commit {parent[:12]}" if parent else "the repository")
                + " already has every change the session merged"
            )
        return {"commit": None, "files": [], "left_out": landing.left_out,
                "notes": landing.notes}  # fmt: skip
    command = ["commit-tree", tree, "--no-gpg-sign"]
    if parent is not None:
        command += ["-p", parent]
    message = str(order.get("message") or args["message"].rstrip() + "\n")
    sha = git(ctx, *command, "-F", "-", env=env, input=message).stdout.strip()
    listing = ["diff-tree", "-r", "--name-only", "-z", "--no-commit-id", "--no-renames"]
    if parent is None:
        listing.append("--root")
    files = [f for f in git(ctx, *listing, sha, env=env).stdout.split("\0") if f]
    return {
        "commit": sha,
        "parent": parent,
        "ref": ref,
        "tree": tree,
        "objects": OBJECTS,
        "index": PERSON_INDEX,
        "index_base": base,
        "files": files,
        "author": f"{author['name']} <{author['email']}>",
        "left_out": landing.left_out,
        "notes": landing.notes,
    }


class GitTool(ToolPlugin):
    name = "git-tool"
    version = 1

    def tools(self) -> list[ToolDefinition]:
        return [STATUS, DIFF, COMMIT]

    def handlers(self) -> dict[str, Handler]:
        return {"git.status": status, "git.diff": diff, "git.commit": commit}


PLUGIN = GitTool()
