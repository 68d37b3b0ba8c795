"""A taken-over kernel gains nothing on the host through the project it writes (ADR-053).

L1 is started for a root-owned project (the kernel: uid 10000 with CAP_DAC_OVERRIDE and
CAP_CHOWN, its own seccomp profile); code then runs inside it exactly as the kernel does
(``<engine> exec`` replaying L1's own ``setpriv`` drop) and tries to leave something
privileged in the project: a setuid-root copy of /bin/sh both ways round, a setuid file
made by open, by mknod and by fchmodat, a device node, a symlink out, a write through a
link, a file given to another user, a change to ``.git/config`` or ``.git/hooks`` (git on
the host runs what they name).  Each must fail with its errno, on Docker and
Podman, and the host must find no setuid/setgid file, device or new link; a merge-like
write (temp file, chmod, chown to the folder's owner, rename) and the kernel's own
``write_atomic`` still keep owners and modes.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fluffy.seccomp.compile import to_oci
from fluffy.seccomp.kernel_profile import KERNEL_PROFILE
from tests.integration.test_l1_kernel import _fluffy, _inspect, l1  # noqa: F401 (fixture)

#: Run inside L1 as the kernel: each attempt's outcome ("ok" or the errno's name), and
#: the process's identity beside the kernel's own (pid 1).
ATTEMPTS = textwrap.dedent(
    """
    import errno, json, os, shutil, stat
    from fluffy.kernel.confined_files import write_atomic
    P = "/fluffy/project"
    out = {}
    def attempt(name, fn):
        try:
            fn()
            out[name] = "ok"
        except OSError as exc:
            out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
    def status(pid):
        lines = open(f"/proc/{pid}/status").read().splitlines()
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        keys = ("Uid", "Gid", "Groups", "CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb",
                "NoNewPrivs", "Seccomp", "Seccomp_filters")
        return {key: " ".join(fields[key].split()) for key in keys}
    out["self"], out["kernel"] = status("self"), status(1)
    def copy_sh(name):
        shutil.copyfile("/bin/sh", f"{P}/{name}")
        return os.open(f"{P}/{name}", os.O_RDONLY)
    a = copy_sh("sh-a")  # chown to root, then chmod
    attempt("a_fchown_root", lambda: os.fchown(a, 0, 0))
    attempt("a_fchmod_4755", lambda: os.fchmod(a, 0o4755))
    attempt("a_fchmod_0755", lambda: os.fchmod(a, 0o755))  # root's file now: no FOWNER
    b = copy_sh("sh-b")  # chmod, then chown to root
    attempt("b_fchmod_4755", lambda: os.fchmod(b, 0o4755))
    attempt("b_chmod_6755", lambda: os.chmod(f"{P}/sh-b", 0o6755))
    attempt("b_fchmod_0755", lambda: os.fchmod(b, 0o755))
    attempt("b_fchown_root", lambda: os.fchown(b, 0, 0))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    attempt("open_creat_4755", lambda: os.close(os.open(f"{P}/sh-c", flags, 0o4755)))
    attempt("mknod_reg_4755", lambda: os.mknod(f"{P}/sh-d", stat.S_IFREG | 0o4755))
    attempt("mknod_chr", lambda: os.mknod(f"{P}/null", stat.S_IFCHR | 0o666, os.makedev(1, 3)))
    attempt("fchmodat_2755", lambda: os.chmod("sh-b", 0o2755, dir_fd=os.open(P, os.O_RDONLY)))
    attempt("symlink_shadow", lambda: os.symlink("/etc/shadow", f"{P}/shadow"))
    attempt("write_through_link", lambda: open(f"{P}/planted", "a").close())
    attempt("fchown_other_uid", lambda: os.fchown(b, 1234, 0))
    attempt("fchown_other_gid", lambda: os.fchown(b, 0, 1234))
    attempt("chown_path", lambda: os.chown(f"{P}/sh-b", 0, 0))
    def merge_like():  # what a merge does: its own temp file, mode, owner, rename
        fd = os.open(f"{P}/.merged.tmp", flags, 0o600)
        os.write(fd, b"#!/bin/sh\\necho merged\\n")
        os.fchmod(fd, 0o755)
        os.fchown(fd, 0, 0)  # the folder's owner
        os.close(fd)
        os.rename(f"{P}/.merged.tmp", f"{P}/merged.sh")
    attempt("merge_like", merge_like)
    attempt("write_atomic", lambda: (write_atomic(P, "kept.txt", b"new"),
                                     write_atomic(P, "new/deep.txt", b"x", mode=0o644)))
    # what git on the host runs: a filter or fsmonitor in .git/config, a hook
    attempt("git_config_append", lambda: open(f"{P}/.git/config", "a").close())
    attempt("git_hook_create", lambda: open(f"{P}/.git/hooks/pre-commit", "w").close())
    def replace_config():
        with open(f"{P}/.git/config.new", "w") as out_file:
            out_file.write("[core]\\n\\tfsmonitor = touch /tmp/pwned\\n")
        os.rename(f"{P}/.git/config.new", f"{P}/.git/config")
    attempt("git_config_replace", replace_config)
    attempt("git_hooks_replace", lambda: os.rename(f"{P}/.git/hooks", f"{P}/.git/hooks-old"))
    attempt("git_ref_write", lambda: write_atomic(P, ".git/refs/heads/probe", b"0" * 40 + b"\\n"))
    print(json.dumps(out))
    """
)

EXPECTED = {
    "a_fchown_root": "ok",
    "a_fchmod_4755": "EPERM",  # the profile's mode check
    "a_fchmod_0755": "EPERM",  # no CAP_FOWNER: root's file is not the kernel's to chmod
    "b_fchmod_4755": "EPERM",  # a setuid-10000 file: the profile again
    "b_chmod_6755": "EPERM",
    "b_fchmod_0755": "ok",
    "b_fchown_root": "ok",  # the chown clears setuid bits anyway
    "open_creat_4755": "EPERM",
    "mknod_reg_4755": "EPERM",
    "mknod_chr": "EPERM",
    "fchmodat_2755": "EPERM",
    "symlink_shadow": "EPERM",
    "write_through_link": "EROFS",  # L1's /etc/shadow: the host's is not in L1 at all
    "fchown_other_uid": "EPERM",  # CAP_CHOWN would allow it: the profile's owner rule
    "fchown_other_gid": "EPERM",
    "chown_path": "EPERM",  # path chowns are not the kernel's: only fchown
    "merge_like": "ok",
    "write_atomic": "ok",
    "git_config_append": "EROFS",  # read-only over the read-write project
    "git_hook_create": "EROFS",
    "git_config_replace": "EBUSY",  # a mount point cannot be renamed over
    "git_hooks_replace": "EBUSY",
    "git_ref_write": "ok",  # the AI's commits still land
}


def _owner_mode(path: Path) -> tuple[int, int, int]:
    info = path.lstat()
    return info.st_uid, info.st_gid, info.st_mode


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned project's kernel: root sets it up")
def test_a_taken_over_kernel_leaves_nothing_privileged_in_the_project(
    l1: dict[str, Any],  # noqa: F811
) -> None:
    project: Path = l1["project"]
    kept = project / "kept.txt"
    kept.write_text("old")
    kept.chmod(0o640)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    config = (project / ".git" / "config").read_bytes()
    assert (project.stat().st_uid, project.stat().st_gid) == (0, 0)
    started = _fluffy(l1, "start")
    assert started.returncode == 0, started.stdout + started.stderr
    container = json.loads(_fluffy(l1, "status").stdout)["container_id"]
    info = _inspect(l1["cli"], container)
    raw = info["Config"]["Entrypoint"]  # podman's CLI shows it as one string
    entry = raw.split() if isinstance(raw, str) else raw
    drop = entry[: entry.index("--") + 1]
    assert drop[0] == "setpriv" and "--reuid=10000" in drop  # L1's own, replayed below
    (project / "planted").symlink_to("/etc/shadow")  # a link a host user left there
    shadow = hashlib.sha256(Path("/etc/shadow").read_bytes()).hexdigest()

    done = subprocess.run(
        [l1["cli"], "exec", container, *drop, "python3", "-c", ATTEMPTS],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    me, kernel = found.pop("self"), found.pop("kernel")
    assert me["Uid"] == kernel["Uid"] == "10000 10000 10000 10000" and me["Groups"] == ""
    for key in ("CapEff", "CapPrm", "CapBnd", "CapAmb"):
        assert me[key] == kernel[key] == "0000000000000003", key  # chown, dac_override
    assert me["NoNewPrivs"] == kernel["NoNewPrivs"] == "1"
    assert me["Seccomp"] == kernel["Seccomp"] == "2"
    assert me["Seccomp_filters"] == kernel["Seccomp_filters"]  # the same profile as the kernel
    assert found == EXPECTED

    # what L1 was given: the kernel profile with the project's owner (Podman: from a file
    # beside the project's folder, which L1 does not mount)
    (given,) = [o[8:] for o in info["HostConfig"]["SecurityOpt"] if o.startswith("seccomp=")]
    if l1["cli"] == "podman":
        assert given == str(l1["paths"]["base"].with_suffix(".seccomp.json"))
        given = Path(given).read_text()
    assert json.loads(given) == to_oci(KERNEL_PROFILE, (0, 0))

    # on the host: nothing setuid/setgid, no device, no link but the planted one
    for path in [project, *project.rglob("*")]:
        mode = path.lstat().st_mode
        assert not mode & (stat.S_ISUID | stat.S_ISGID), path
        assert stat.S_ISREG(mode) or stat.S_ISDIR(mode) or path.name == "planted", path
    assert hashlib.sha256(Path("/etc/shadow").read_bytes()).hexdigest() == shadow
    assert (project / ".git" / "config").read_bytes() == config
    assert not (project / ".git" / "hooks" / "pre-commit").exists()
    assert not (project / "sh-c").exists() and not (project / "sh-d").exists()
    uid, gid, mode = _owner_mode(project / "sh-a")  # root's, with the mode it was made with
    assert (uid, gid) == (0, 0) and stat.S_IMODE(mode) == 0o644
    assert _owner_mode(project / "sh-b") == (0, 0, stat.S_IFREG | 0o755)
    assert _owner_mode(project / "merged.sh") == (0, 0, stat.S_IFREG | 0o755)
    assert (project / "merged.sh").read_text() == "#!/bin/sh\necho merged\n"
    assert _owner_mode(kept) == (0, 0, stat.S_IFREG | 0o640) and kept.read_text() == "new"
    assert _owner_mode(project / "new")[:2] == (0, 0)
    assert _owner_mode(project / "new" / "deep.txt") == (0, 0, stat.S_IFREG | 0o644)
