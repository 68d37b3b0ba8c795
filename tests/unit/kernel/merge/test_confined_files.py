"""Confinement: safe paths, no-follow walks, and the attack matrix against ingest.

Every attack runs a real ingest over real files (symlinks, fifos, devices when root) and
checks that it is refused with nothing written to the project and nothing staged.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fluffy.errors import MergeError, MergeRefused, PatchRejected
from fluffy.kernel.confined_files import (
    ProtectedPaths,
    read_existing,
    read_regular,
    safe_relpath,
    write_atomic,
)
from fluffy.kernel.merge.ingest import ingest
from fluffy.kernel.merge.patch import unified_diff
from fluffy.kernel.merge.staging import Staging

# -- safe_relpath ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("src/a.py", "src/a.py"),
        ("./src//a.py", "src/a.py"),
        ("a/./b", "a/b"),
        (".gitignore", ".gitignore"),
        ("docs/.github/x", "docs/.github/x"),
        ("spaces are fine.txt", "spaces are fine.txt"),
        ("ünïcode/名前.txt", "ünïcode/名前.txt"),
    ],
)
def test_safe_relpath_normalises(raw: str, expected: str) -> None:
    assert safe_relpath(raw) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("a/..", "'..'"),
        (".", "root itself"),
        ("./", "directory"),
        ("a/b/", "directory"),
        ("a\x00b", "NUL"),
        ("a\\b", "backslash"),
        ("a\nb", "control character"),
        ("a\tb", "control character"),
        (".git/config", ".git"),
        (".git", ".git"),
        (".GIT/hooks/pre-commit", ".git"),
        ("sub/.git/hooks/post-checkout", ".git"),
        ("x" * 5000, "longer"),
    ],
)
def test_safe_relpath_refuses(raw: str, reason: str) -> None:
    with pytest.raises(MergeRefused) as info:
        safe_relpath(raw)
    assert reason in info.value.why
    assert info.value.fix


def test_safe_relpath_refuses_non_strings() -> None:
    with pytest.raises(MergeRefused):
        safe_relpath(None)  # type: ignore[arg-type]


def test_protected_defaults_always_apply() -> None:
    guard = ProtectedPaths(["secrets/**"])
    for path in (".fluffy/policy.yaml", ".fluffy", ".fluffy/a/b", "secrets/key"):
        assert guard.matches(path), path
        with pytest.raises(MergeRefused, match="protected"):
            guard.check(path)
    for path in ("src/.fluffyrc", "fluffy/x.py", "src/secrets.py"):
        assert not guard.matches(path), path
        guard.check(path)


# -- the no-follow primitives ---------------------------------------------------------


def test_read_existing_refuses_links_and_special_files(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    root = tmp_path / "root"
    root.mkdir()
    (root / "file").write_text("ok")
    (root / "link").symlink_to(outside / "secret")
    (root / "dirlink").symlink_to(outside)
    os.mkfifo(root / "fifo")
    (root / "dir").mkdir()
    assert read_existing(root, "file", 10) == b"ok"
    assert read_existing(root, "absent", 10) is None
    assert read_existing(root, "absent/deeper", 10) is None
    for rel, kind in [
        ("link", "symbolic link"),
        ("dirlink/secret", "symbolic link"),
        ("fifo", "fifo"),
        ("dir", "directory"),
        ("file/below", "regular file"),  # a file where a folder should be
    ]:
        with pytest.raises(MergeRefused) as info:
            read_existing(root, rel, 10)
        assert kind in info.value.why, (rel, info.value.why)
    with pytest.raises(MergeRefused, match="more than 1"):
        read_existing(root, "file", 1)


def test_read_regular_requires_the_file(tmp_path: Path) -> None:
    with pytest.raises(MergeRefused, match="does not exist"):
        read_regular(tmp_path, "missing", 10)
    with pytest.raises(MergeRefused, match=r"'\.\.'"):
        read_regular(tmp_path, "../etc/passwd", 10)


def test_write_atomic_creates_replaces_and_keeps_mode(tmp_path: Path) -> None:
    write_atomic(tmp_path, "a/b/c.txt", b"one")
    assert (tmp_path / "a/b/c.txt").read_bytes() == b"one"
    target = tmp_path / "script.sh"
    target.write_text("old")
    target.chmod(0o750)
    inode = target.stat().st_ino
    write_atomic(tmp_path, "script.sh", b"new")
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert target.stat().st_ino != inode  # replaced by rename, not rewritten in place
    write_atomic(tmp_path, "explicit", b"x", mode=0o644, dir_mode=0o755)
    assert stat.S_IMODE((tmp_path / "explicit").stat().st_mode) == 0o644
    assert not [p for p in tmp_path.rglob("*") if "fluffy" in p.name]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another owner needs CAP_CHOWN")
def test_write_atomic_keeps_the_owner_of_the_project(tmp_path: Path) -> None:
    """A merge never changes who owns the user's files: a replaced file keeps its owner
    and group, a new file or folder takes the owner of the folder it is made in."""
    project = tmp_path / "project"
    project.mkdir()
    os.chown(project, 1234, 1235)
    old = project / "kept.py"
    old.write_text("old")
    os.chown(old, 2000, 2001)
    old.chmod(0o640)
    write_atomic(project, "kept.py", b"new")
    assert (old.stat().st_uid, old.stat().st_gid, stat.S_IMODE(old.stat().st_mode)) == (
        2000, 2001, 0o640)  # fmt: skip
    write_atomic(project, "deep/new.py", b"x")
    for made in (project / "deep", project / "deep" / "new.py"):
        assert (made.stat().st_uid, made.stat().st_gid) == (1234, 1235), made


WRITE_AS_KERNEL = """
import sys
from fluffy.kernel.confined_files import write_atomic
write_atomic(sys.argv[1], "kept.py", b"new")
write_atomic(sys.argv[1], "deep/new.sh", b"x", mode=0o755, dir_mode=0o750)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="replays L1's drop from root"
)
def test_write_atomic_keeps_owners_and_modes_with_only_the_kernels_capabilities(
    tmp_path: Path,
) -> None:
    """A root-owned project's kernel: uid 10000 with L1's file capabilities only (no
    CAP_FOWNER, so it can chmod only its own files): modes are set before the chown."""
    from fluffy.bootstrap import l1
    from fluffy.bootstrap.engine import Engine

    project = tmp_path / "project"
    project.mkdir()
    old = project / "kept.py"
    old.write_text("old")
    old.chmod(0o640)
    entry = l1.spec("img", str(project), "id", "r", "s", Engine("docker", "/nonexistent"))
    drop = entry["Entrypoint"][: entry["Entrypoint"].index("--") + 1]  # L1's own setpriv
    assert drop[0] == "setpriv" and not any("fowner" in flag for flag in drop)
    done = subprocess.run([*drop, sys.executable, "-c", WRITE_AS_KERNEL, str(project)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert old.read_bytes() == b"new"
    assert (old.stat().st_uid, old.stat().st_gid, stat.S_IMODE(old.stat().st_mode)) == (0, 0, 0o640)
    for made, mode in ((project / "deep", 0o750), (project / "deep" / "new.sh", 0o755)):
        info = made.stat()
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, mode), made


def test_write_atomic_removes_a_stale_temp_of_its_name(tmp_path: Path) -> None:
    (tmp_path / ".stale.tmp").write_text("half-written")
    write_atomic(tmp_path, "f", b"data", temp_name=".stale.tmp")
    assert (tmp_path / "f").read_bytes() == b"data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_write_atomic_never_follows(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "dirlink").symlink_to(outside)
    (root / "filelink").symlink_to(outside / "target")
    for rel in ("dirlink/new.txt", "dirlink/deep/new.txt", "filelink"):
        with pytest.raises(MergeRefused):
            write_atomic(root, rel, b"evil")
    assert list(outside.iterdir()) == []


# -- the attack matrix ----------------------------------------------------------------


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under root: kind and content (links: their target), never followed."""
    out: dict[str, object] = {}
    for folder, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(folder) / name
            info = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(info.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                out[rel] = ("file", path.read_bytes(), stat.S_IMODE(info.st_mode))
            else:
                out[rel] = ("other", stat.S_IFMT(info.st_mode))
    return out


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.project = tmp_path / "project"
        self.call = tmp_path / "output" / "call-1"
        self.outside = tmp_path / "outside"
        for folder in (self.project / "src", self.call, self.outside):
            folder.mkdir(parents=True)
        (self.project / "src/a.py").write_text("a = 1\n")
        (self.project / "README").write_text("readme\n")
        (self.outside / "victim").write_text("victim\n")
        self.staging = Staging(tmp_path / "state/staging/s1", self.project)

    def out(self, name: str, data: str | bytes) -> str:
        path = self.call / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return name

    def good(self) -> list[dict[str, str]]:
        patch = unified_diff("src/a.py", "a = 1\n", "a = 2\n")
        return [
            {"path": "src/new.py", "op": "full", "file": self.out("0.content", "new\n")},
            {"path": "src/a.py", "op": "patch", "file": self.out("1.diff", patch)},
        ]


def _symlinked_output(s: Setup) -> list[dict[str, str]]:
    (s.call / "0.content").symlink_to("/etc/passwd")
    return [{"path": "src/x.py", "op": "full", "file": "0.content"}]


def _output_through_linked_dir(s: Setup) -> list[dict[str, str]]:
    (s.call / "sub").symlink_to(s.outside)
    return [{"path": "src/x.py", "op": "full", "file": "sub/victim"}]


def _output_fifo(s: Setup) -> list[dict[str, str]]:
    os.mkfifo(s.call / "0.content")
    return [{"path": "src/x.py", "op": "full", "file": "0.content"}]


def _output_escape(s: Setup) -> list[dict[str, str]]:
    return [{"path": "src/x.py", "op": "full", "file": "../../outside/victim"}]


def _oversized(s: Setup) -> list[dict[str, str]]:
    return [{"path": "src/x.py", "op": "full", "file": s.out("0.content", b"x" * 2048)}]


def _full(path: str) -> Callable[[Setup], list[dict[str, str]]]:
    def make(s: Setup) -> list[dict[str, str]]:
        return [{"path": path, "op": "full", "file": s.out("0.content", "evil\n")}]

    return make


def _through_linked_project_dir(name: str) -> Callable[[Setup], list[dict[str, str]]]:
    def make(s: Setup) -> list[dict[str, str]]:
        (s.project / "link").symlink_to(s.outside)
        return _full(f"link/{name}")(s)

    return make


def _linked_target(s: Setup) -> list[dict[str, str]]:
    (s.project / "src/linked.py").symlink_to(s.outside / "victim")
    return _full("src/linked.py")(s)


def _delete_linked_target(s: Setup) -> list[dict[str, str]]:
    (s.project / "src/linked.py").symlink_to(s.outside / "victim")
    return [{"path": "src/linked.py", "op": "delete"}]


def _fifo_target(s: Setup) -> list[dict[str, str]]:
    os.mkfifo(s.project / "src/pipe")
    return _full("src/pipe")(s)


def _directory_target(s: Setup) -> list[dict[str, str]]:
    return _full("src")(s)


def _file_as_folder(s: Setup) -> list[dict[str, str]]:
    return _full("README/inside.txt")(s)


def _device_target(s: Setup) -> list[dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("creating a device node needs root")
    try:
        os.mknod(s.project / "src/dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("this container may not create device nodes")
    return _full("src/dev")(s)


def _not_applying(s: Setup) -> list[dict[str, str]]:
    patch = unified_diff("src/a.py", "a = 100\n", "a = 2\n")
    return [{"path": "src/a.py", "op": "patch", "file": s.out("0.diff", patch)}]


def _patch_for_other_path(s: Setup) -> list[dict[str, str]]:
    patch = unified_diff("README", "readme\n", "pwned\n")
    return [{"path": "src/a.py", "op": "patch", "file": s.out("0.diff", patch)}]


def _bad_among_good(s: Setup) -> list[dict[str, str]]:
    return [*s.good(), {"path": "../escape", "op": "full", "file": "0.content"}]


def _good_then_bad_patch(s: Setup) -> list[dict[str, str]]:
    return [*s.good(), *_not_applying(s)]


def _malformed_change(s: Setup) -> list[dict[str, str]]:
    return [*s.good(), {"path": "src/z.py", "op": "chmod", "file": "0.content"}]


ATTACKS: dict[str, tuple[Callable[[Setup], list[dict[str, str]]], type[MergeError]]] = {
    "output file is a symlink to /etc/passwd": (_symlinked_output, MergeRefused),
    "output file through a symlinked folder": (_output_through_linked_dir, MergeRefused),
    "output file is a fifo": (_output_fifo, MergeRefused),
    "output file name climbs out": (_output_escape, MergeRefused),
    "output file over the size cap": (_oversized, MergeRefused),
    "../ path": (_full("../outside/victim"), MergeRefused),
    "nested ../ path": (_full("src/../../outside/victim"), MergeRefused),
    "absolute path": (_full(str(Path("/tmp/fluffy-evil"))), MergeRefused),
    "existing file through a symlinked project folder": (
        _through_linked_project_dir("victim"),
        MergeRefused,
    ),
    "new file through a symlinked project folder": (
        _through_linked_project_dir("new/file.txt"),
        MergeRefused,
    ),
    "target is a symlink": (_linked_target, MergeRefused),
    "delete of a symlink": (_delete_linked_target, MergeRefused),
    "target is a fifo": (_fifo_target, MergeRefused),
    "target is a device": (_device_target, MergeRefused),
    "target is a directory": (_directory_target, MergeRefused),
    "a file used as a folder": (_file_as_folder, MergeRefused),
    "write to .fluffy/policy.yaml": (_full(".fluffy/policy.yaml"), MergeRefused),
    "write under .git": (_full(".git/hooks/pre-commit"), MergeRefused),
    "write to .git itself": (_full(".git"), MergeRefused),
    "newline in the path": (_full("src/a\n.py"), MergeRefused),
    "patch that does not apply": (_not_applying, PatchRejected),
    "patch for another path": (_patch_for_other_path, PatchRejected),
    "one bad path among good changes": (_bad_among_good, MergeRefused),
    "one bad patch among good changes": (_good_then_bad_patch, PatchRejected),
    "unknown op among good changes": (_malformed_change, MergeRefused),
}


@pytest.mark.timeout(30)  # a fifo that were opened for reading would block here
@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_refused_and_nothing_changes(tmp_path: Path, name: str) -> None:
    make, error = ATTACKS[name]
    s = Setup(tmp_path)
    changes = make(s)
    before_project, before_outside = snapshot(s.project), snapshot(s.outside)
    with pytest.raises(error) as info:
        ingest(s.call, changes, s.staging, max_file_bytes=1024)
    assert info.value.what and info.value.why
    assert snapshot(s.project) == before_project
    assert snapshot(s.outside) == before_outside
    assert s.staging.is_empty()
    assert list(s.staging.tree.iterdir()) == []
    assert (s.staging.root / "deleted.txt").read_text() == ""


def test_extra_protected_globs(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    changes = _full("config/secrets/prod.yaml")(s)
    with pytest.raises(MergeRefused, match="protected"):
        ingest(s.call, changes, s.staging, protected=["config/secrets/**"])
    assert s.staging.is_empty()
    # the same change without the extra glob is fine (the refusal came from the glob)
    assert [c.path for c in ingest(s.call, changes, s.staging)] == ["config/secrets/prod.yaml"]


def test_good_changes_alone_are_staged(tmp_path: Path) -> None:
    """Control for the matrix: the good changes it mixes in are accepted on their own."""
    s = Setup(tmp_path)
    staged = ingest(s.call, s.good(), s.staging)
    assert sorted(c.path for c in staged) == ["src/a.py", "src/new.py"]
    assert s.staging.read("src/a.py") == b"a = 2\n"
    assert (s.project / "src/a.py").read_text() == "a = 1\n"  # the project is untouched
