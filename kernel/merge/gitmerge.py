"""Merging a git.commit sandbox's output into ``<project>/.git`` (the only writer of .git).

The sandbox writes loose objects (``<output>/<call>/git-objects/ab/cdef...``) and an
index file, and returns ``{"commit", "parent", "ref", "objects", "index"}``.
:func:`prepare_git` validates everything before anything is written:

* every object name is 2+38 lowercase hex, the file is regular (read without following
  links) and under the size cap, and it inflates to ``<type> <len>\\0<body>`` whose
  sha1 is its name (no trailing data, the length matches);
* the commit is one of them, its parents are exactly ``[parent]`` (or none), its tree and
  every entry of every new tree exist (new, loose in the repo, or in a pack); tree entry
  names are plain (no ``.``, ``..``, ``.git``, ``/``);
* ``.git/HEAD`` points to ``ref`` and the ref's current value (loose or packed-refs) is
  ``parent`` -- else :class:`~fluffy.errors.MergeConflict` and nothing is written;
* the index has git's signature, a known version and a valid checksum.

The steps then copy the missing objects, compare-and-swap the ref (a loose ref file) and
replace ``.git/index``, each atomically and idempotently.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from fluffy.errors import MergeConflict, MergeRefused
from fluffy.kernel.confined_files import (
    FileChanged,
    TargetLocked,
    parent_dir,
    read_existing,
    read_regular,
    refused,
    relative_parts,
    remove_file,
    write_atomic,
)
from fluffy.kernel.merge.oplog import MergeOperation, MergeStep, StepResult

MAX_OBJECT_BYTES = 64 * 1024 * 1024  # one compressed object
MAX_INFLATED_BYTES = 256 * 1024 * 1024  # one object once inflated
MAX_TOTAL_BYTES = 512 * 1024 * 1024  # every object of one commit, compressed
MAX_INDEX_BYTES = 64 * 1024 * 1024
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX2 = re.compile(r"[0-9a-f]{2}")
_HEX38 = re.compile(r"[0-9a-f]{38}")
_REF = re.compile(r"refs/heads/[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*")
_TYPES = (b"blob", b"tree", b"commit", b"tag")
_GITLINK = 0o160000


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data, usedforsecurity=False).hexdigest()


def valid_ref(ref: object) -> str:
    if not isinstance(ref, str) or not _REF.fullmatch(ref) or ".." in ref or ref.endswith(".lock"):
        raise MergeRefused(
            f"git.commit named the ref {ref!r}",
            why="only plain branch names under refs/heads/ are merged",
        )
    return ref


def _commit_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not _HEX40.fullmatch(value):
        raise MergeRefused(f"git.commit returned {what} {value!r}, not a 40-hex commit id")
    return value


def inflate(name: str, data: bytes) -> tuple[bytes, bytes]:
    """(type, body) of loose object ``name``; MergeRefused unless it hashes to its name."""
    shown = f"git object {name}"
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, MAX_INFLATED_BYTES + 1)
    except zlib.error as exc:
        raise refused(shown, f"it is not zlib data ({exc})") from None
    if len(raw) > MAX_INFLATED_BYTES or inflater.unconsumed_tail:
        raise refused(shown, f"it inflates to more than {MAX_INFLATED_BYTES} bytes")
    if not inflater.eof or inflater.unused_data:
        raise refused(shown, "its zlib stream is truncated or followed by other data")
    header, sep, body = raw.partition(b"\0")
    kind, _, size = header.partition(b" ")
    if not sep or kind not in _TYPES or not size.isdigit() or int(size) != len(body):
        raise refused(shown, "it is not '<type> <length>\\0<content>'")
    if _sha1(raw) != name:
        raise refused(shown, "its content does not hash to its name (corrupt or forged)")
    return kind, body


class RepoObjects:
    """Which objects the project's repository has (loose, or in a v2 pack index)."""

    def __init__(self, project: Path) -> None:
        self.project = project
        self._packed: list[bytes] | None = None

    def loose(self, sha: str) -> bool:
        with parent_dir(self.project, f".git/objects/{sha[:2]}/{sha[2:]}") as found:
            if found is None:
                return False
            try:
                info = os.stat(found[1], dir_fd=found[0], follow_symlinks=False)
            except FileNotFoundError:
                return False
            return stat.S_ISREG(info.st_mode)

    def _indexes(self) -> list[bytes]:
        if self._packed is None:
            self._packed = []
            with parent_dir(self.project, ".git/objects/pack/x") as found:
                if found is not None:
                    with os.scandir(found[0]) as entries:
                        names = sorted(e.name for e in entries if e.name.endswith(".idx"))
                    for name in names:
                        data = read_existing(self.project, f".git/objects/pack/{name}", 1 << 31)
                        if data and data[:8] == b"\xfftOc\x00\x00\x00\x02":
                            self._packed.append(data)
        return self._packed

    def packed(self, sha: str) -> bool:
        want = bytes.fromhex(sha)
        for idx in self._indexes():
            fanout = 8
            first = want[0]
            lo = int.from_bytes(idx[fanout + 4 * (first - 1) : fanout + 4 * first]) if first else 0
            hi = int.from_bytes(idx[fanout + 4 * first : fanout + 4 * first + 4])
            names = fanout + 256 * 4
            while lo < hi:
                mid = (lo + hi) // 2
                found = idx[names + 20 * mid : names + 20 * mid + 20]
                if found == want:
                    return True
                if found < want:
                    lo = mid + 1
                else:
                    hi = mid
        return False

    def has(self, sha: str) -> bool:
        return self.loose(sha) or self.packed(sha)


def _scan_objects(call_dir: Path, folder: str) -> Iterator[str]:
    """Object ids in the sandbox's objects folder; anything but loose objects is refused."""
    base = "/".join(relative_parts(folder))
    with parent_dir(call_dir, f"{base}/x") as found:
        if found is None:
            raise refused(folder, "the objects folder does not exist")
        dir_fd = found[0]
        with os.scandir(dir_fd) as entries:
            top = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in entries)
        for name, is_dir in top:
            if not is_dir:
                raise refused(f"{folder}/{name}", "only folders belong in the objects folder")
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            try:
                with os.scandir(sub) as entries:
                    inner = sorted(entries, key=lambda e: e.name)
                    if name in ("info", "pack"):
                        if inner:
                            raise refused(f"{folder}/{name}", "packs and info files are not merged")
                        continue
                    if not _HEX2.fullmatch(name):
                        raise refused(f"{folder}/{name}", "not a loose-object folder")
                    for entry in inner:
                        if not _HEX38.fullmatch(entry.name) or not entry.is_file(
                            follow_symlinks=False
                        ):
                            raise refused(
                                f"{folder}/{name}/{entry.name}", "not a loose object file"
                            )
                        yield name + entry.name
            finally:
                os.close(sub)


def _tree_entries(sha: str, body: bytes) -> Iterator[tuple[int, str]]:
    at = 0
    while at < len(body):
        space = body.find(b" ", at)
        nul = body.find(b"\0", space + 1)
        if space < 0 or nul < 0 or nul + 21 > len(body):
            raise refused(f"git tree {sha}", "its entries are malformed")
        mode, name = body[at:space], body[space + 1 : nul]
        if not mode.isdigit() or name in (b"", b".", b"..") or b"/" in name:
            raise refused(f"git tree {sha}", f"it has an invalid entry {name!r}")
        if name.lower() == b".git":
            raise refused(f"git tree {sha}", "it has an entry named .git")
        yield int(mode, 8), body[nul + 1 : nul + 21].hex()
        at = nul + 21


def _commit_links(sha: str, body: bytes) -> tuple[str, list[str]]:
    tree: str | None = None
    parents: list[str] = []
    for line in body.split(b"\n"):
        if not line:
            break
        key, _, value = line.partition(b" ")
        if key == b"tree" and tree is None:
            tree = value.decode("ascii", "replace")
        elif key == b"parent":
            parents.append(value.decode("ascii", "replace"))
    if tree is None or not _HEX40.fullmatch(tree):
        raise refused(f"git commit {sha}", "it has no valid tree line")
    return tree, parents


def head_ref(project: Path) -> str:
    data = read_existing(project, ".git/HEAD", 4096)
    text = (data or b"").decode("utf-8", "replace").strip()
    if not text.startswith("ref: "):
        raise MergeRefused(
            "the project's HEAD is not a branch (detached or missing)",
            fix="Check out the branch git.commit commits to, then commit again.",
        )
    return text[5:].strip()


def read_ref(project: Path, ref: str) -> str | None:
    """The ref's commit id: the loose ref file, else packed-refs, else None."""
    return ref_value(project, ref, read_existing(project, f".git/{ref}", 4096))


def ref_value(project: Path, ref: str, loose: bytes | None) -> str | None:
    """:func:`read_ref` with the loose ref file's bytes read already (None: absent)."""
    if loose is not None:
        value = loose.decode("utf-8", "replace").strip()
        if not _HEX40.fullmatch(value):
            raise MergeRefused(f"the ref {ref} holds {value[:60]!r}, not a commit id")
        return value
    packed = read_existing(project, ".git/packed-refs", MAX_INDEX_BYTES) or b""
    for line in packed.decode("utf-8", "replace").splitlines():
        if line.startswith(("#", "^")):
            continue
        value, _, name = line.partition(" ")
        if name == ref and _HEX40.fullmatch(value):
            return value
    return None


def check_index(data: bytes) -> None:
    version = int.from_bytes(data[4:8]) if len(data) >= 8 else 0
    if len(data) < 32 or data[:4] != b"DIRC" or version not in (2, 3, 4):
        raise refused("git index", "it is not a git index file (signature or version)")
    if hashlib.sha1(data[:-20], usedforsecurity=False).digest() != data[-20:]:
        raise refused("git index", "its checksum does not match its content")


def locked(project: Path, rel: str) -> bool:
    with parent_dir(project, f".git/{rel}.lock") as found:
        if found is None:
            return False
        try:
            os.stat(found[1], dir_fd=found[0], follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True


def prepare_git(
    project: Path, call_dir: Path, result: object
) -> tuple[list[MergeStep], dict[str, bytes]]:
    """Validate a git.commit result (see the module docstring): (steps, sources)."""
    if not isinstance(result, dict):
        raise MergeRefused("the git.commit result is not an object")
    commit = _commit_id(result.get("commit"), "commit")
    raw_parent = result.get("parent")
    parent = None if raw_parent is None else _commit_id(raw_parent, "parent")
    ref = valid_ref(result.get("ref"))
    objects_dir, index_name = result.get("objects"), result.get("index")
    if not isinstance(objects_dir, str) or not isinstance(index_name, str):
        raise MergeRefused("the git.commit result lacks its objects folder or index file")
    if head_ref(project) != ref:
        raise MergeRefused(f"the project's HEAD does not point to {ref}")
    _check_ref(project, ref, parent)
    repo = RepoObjects(project)
    new: dict[str, bytes] = {}
    kinds: dict[str, tuple[bytes, bytes]] = {}
    total = 0
    for sha in _scan_objects(call_dir, objects_dir):
        data = read_regular(call_dir, f"{objects_dir}/{sha[:2]}/{sha[2:]}", MAX_OBJECT_BYTES)
        total += len(data)
        if total > MAX_TOTAL_BYTES:
            raise refused(objects_dir, f"the objects exceed {MAX_TOTAL_BYTES} bytes in all")
        kind, body = inflate(sha, data)
        kinds[sha] = (kind, body if kind in (b"tree", b"commit") else b"")
        if not repo.loose(sha):
            new[sha] = data
    if commit not in kinds or kinds[commit][0] != b"commit":
        raise refused(objects_dir, f"the commit {commit} is not among the objects")
    tree, parents = _commit_links(commit, kinds[commit][1])
    if parents != ([] if parent is None else [parent]):
        raise refused(f"git commit {commit}", f"its parents {parents} are not [{parent}]")
    needed = [tree]
    for sha, (kind, body) in kinds.items():
        if kind == b"tree":
            needed += [ref_sha for mode, ref_sha in _tree_entries(sha, body) if mode != _GITLINK]
    for sha in needed:
        if sha not in kinds and not repo.has(sha):
            raise refused(f"git commit {commit}", f"it refers to {sha}, which is nowhere")
    index = read_regular(call_dir, index_name, MAX_INDEX_BYTES)
    check_index(index)
    sources = {f"objects/{sha}": data for sha, data in new.items()}
    sources["index"] = index
    steps = [
        MergeStep("objects", "git_objects", "objects", source="objects"),
        MergeStep("ref", "git_ref", ref, base_sha256=parent, new_sha256=commit),
        MergeStep(
            "index",
            "git_index",
            "index",
            # the person's index the commit's was made from: swapped only if unchanged
            base_sha256=_index_base(result.get("index_base")),
            new_sha256=hashlib.sha256(index).hexdigest(),
            source="index",
        ),
    ]
    return steps, sources


#: Why the person's index was left as it is after the commit.
INDEX_MOVED = (
    "your git index changed while the commit was made, so it was kept as it is: `git "
    "status` may show the committed files as changed until `git reset -q -- <files>`"
)


def _index_base(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise MergeRefused("the git.commit result's index_base is not a sha256")
    return value


def _check_ref(project: Path, ref: str, parent: str | None) -> None:
    current = read_ref(project, ref)
    if current != parent:
        raise MergeConflict(
            f"{ref} is at {current or 'nothing'}, the commit was made on {parent or 'nothing'}",
            why="the branch moved after the commit was made (compare-and-swap failed)",
            fix="Commit again on top of the branch's current commit.",
        )
    for rel in (ref, "index"):
        if locked(project, rel):
            raise MergeConflict(
                f"git is busy: .git/{rel}.lock exists",
                why="another git process is updating the repository",
                fix="Wait for it to finish (or remove a stale lock), then commit again.",
            )


def apply_git_step(
    project: Path,
    op: MergeOperation,
    step: MergeStep,
    *,
    source: Callable[[str], bytes],
    names: Callable[[str], list[str]],
) -> StepResult:
    """Apply one git step idempotently (already done -> "already")."""
    tag = f".fluffy-merge-{op.id[:16]}-{step.id}"
    if step.action == "git_objects":
        copied = 0
        for sha in names("objects"):
            rel = f".git/objects/{sha[:2]}/{sha[2:]}"
            if RepoObjects(project).loose(sha):
                continue
            data = source(f"objects/{sha}")
            write_atomic(project, rel, data, mode=0o444, temp_name=f"{tag}-{sha[:12]}.tmp")
            copied += 1
        return StepResult("applied" if copied else "already", f"{copied} objects copied")
    if step.action == "git_ref":
        loose = read_existing(project, f".git/{step.path}", 4096)  # what the write expects
        current = ref_value(project, step.path, loose)
        if current == step.new_sha256:
            return StepResult("already")
        if current != step.base_sha256 or head_ref(project) != step.path:
            return StepResult("conflict", f"{step.path} moved to {current or 'nothing'}")
        data = f"{step.new_sha256}\n".encode()
        return _locked_write(project, step.path, data, loose, 4096, mode=0o644)
    ref_result = op.results.get("ref")
    if ref_result is not None and ref_result.outcome in ("conflict", "refused"):
        return StepResult("skipped", "the ref was not updated, so the index is kept")
    current_index = read_existing(project, ".git/index", MAX_INDEX_BYTES)
    current = None if current_index is None else hashlib.sha256(current_index).hexdigest()
    if current is not None and current == step.new_sha256:
        return StepResult("already")
    if current != step.base_sha256:
        return StepResult("skipped", INDEX_MOVED)
    return _locked_write(project, "index", source("index"), current_index, MAX_INDEX_BYTES)


def _locked_write(
    project: Path, rel: str, data: bytes, before: bytes | None, most: int, mode: int | None = None
) -> StepResult:
    """``.git/<rel>`` replaced as git does it: through ``<rel>.lock``, taken only when no
    git process holds it (one run meanwhile then fails or waits instead of being
    overwritten), and only while the file still holds ``before``."""
    expected = None if before is None else hashlib.sha256(before).hexdigest()
    if read_existing(project, f".git/{rel}.lock", most) == data:
        # this very write, cut off by a kill before its rename: the lock is ours
        remove_file(project, f".git/{rel}.lock")
    try:
        write_atomic(project, f".git/{rel}", data, mode=mode, unchanged=(expected, most), lock=True)
    except TargetLocked:
        return StepResult("conflict", f"git is busy: .git/{rel}.lock exists")
    except FileChanged:
        return StepResult("conflict", f".git/{rel} changed while it was being written")
    return StepResult("applied")
