"""The git tool plugin: ``git.status``, ``git.diff`` and ``git.commit`` on the project.

``git.commit`` builds the commit without writing the (read-only) project: a temporary
index (``/output/<call>/git-index``) and object folder (``/output/<call>/git-objects``,
with the project's objects as an alternate) receive everything git writes.  The result
names the commit, its parent and the branch ref to move; the kernel imports the objects
and updates the ref when it merges.
"""

from __future__ import annotations

import shutil
from typing import Any

from fluffy.errors import ToolFailed, ToolInputInvalid
from fluffy.plugins.git_tool.gitcmd import git, optional, parse_status, require_repository
from fluffy.plugins.sdk import Handler, ToolContext, ToolDefinition, ToolPlugin, normalise_path

MAX_DIFF_CHARS = 1024 * 1024
MAX_STATUS_ENTRIES = 10000
OBJECTS, INDEX = "git-objects", "git-index"

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
    description="Commit the project's current files (all changes, new files included) on "
    "the current branch. The commit is prepared in the sandbox; the kernel applies it.",
    input_schema={
        "type": "object",
        "properties": {
            "message": {"type": "string", "minLength": 1, "maxLength": 20000},
            "author_name": {"type": "string", "minLength": 1, "maxLength": 200},
            "author_email": {"type": "string", "minLength": 3, "maxLength": 254},
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


def _identity(args: dict[str, Any]) -> tuple[str, str]:
    name = args.get("author_name", "fluffy")
    email = args.get("author_email", "fluffy@localhost")
    for label, value in (("author_name", name), ("author_email", email)):
        if any(char in value for char in "<>\n\r\0"):
            raise ToolInputInvalid(f"{label} may not contain '<', '>' or line breaks")
    return name, email


def commit(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    require_repository(ctx)
    name, email = _identity(args)
    objects = ctx.call_dir / OBJECTS
    for folder in (objects / "info", objects / "pack"):
        folder.mkdir(parents=True, exist_ok=True)
    env = {
        "GIT_INDEX_FILE": str(ctx.call_dir / INDEX),
        "GIT_OBJECT_DIRECTORY": str(objects),
        "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(ctx.workspace / ".git" / "objects"),
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name,
        "GIT_COMMITTER_EMAIL": email,
    }
    parent = optional(ctx, "rev-parse", "-q", "--verify", "HEAD^{commit}", env=env)
    ref = optional(ctx, "symbolic-ref", "-q", "HEAD", env=env)
    if parent is not None:
        git(ctx, "read-tree", parent, env=env)
        # stat data for unchanged files: `add` then hashes and writes changed files only
        # (an object git finds in the project's store is "freshened": a write there)
        git(ctx, "update-index", "-q", "--refresh", env=env, check=False)
    git(ctx, "add", "-A", env=env)
    tree = git(ctx, "write-tree", env=env).stdout.strip()
    if parent is not None:
        before = git(ctx, "rev-parse", f"{parent}^{{tree}}", env=env).stdout.strip()
    else:
        before = git(ctx, "hash-object", "-t", "tree", "--stdin", env=env, input="").stdout.strip()
    if tree == before:
        raise ToolFailed(
            "nothing to commit: the project's files are the same as in "
            + (f"the last commit {parent[:12]}" if parent else "an empty repository"),
            why="a commit records changes, and there are none",
            fix="Make (and merge) a change first, then commit.",
        )
    command = ["commit-tree", tree, "--no-gpg-sign"]
    if parent is not None:
        command += ["-p", parent]
    message = args["message"].rstrip() + "\n"  # as `git commit` leaves it
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
        "index": INDEX,
        "files": files,
    }


class GitTool(ToolPlugin):
    name = "git-tool"
    version = 1

    def tools(self) -> list[ToolDefinition]:
        return [STATUS, DIFF, COMMIT]

    def handlers(self) -> dict[str, Handler]:
        return {"git.status": status, "git.diff": diff, "git.commit": commit}


PLUGIN = GitTool()
