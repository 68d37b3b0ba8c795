"""Project paths given by the AI: normalised to ``a/b/c`` form, or refused.

A path is relative to the project root, uses ``/`` separators, and may not be empty,
absolute, contain ``..``, or lie under a ``.git`` folder (at any depth, any case: git's
own files are never a tool's to change).  Refusals are :class:`ValueError`; the plugin
host reports them as ``tool.input_invalid``.
"""

from __future__ import annotations

MAX_PATH = 4096


def normalise_path(path: object, *, allow_root: bool = False, what: str = "path") -> str:
    """``path`` as ``dir/file`` (no ``.``, no doubled or trailing ``/``).

    ``allow_root`` accepts ``"."`` (and ``""``) for the project root, returned as ``"."``.
    """
    if not isinstance(path, str):
        raise ValueError(f"{what} must be a string, got {type(path).__name__}")
    if "\x00" in path:
        raise ValueError(f"{what} {path!r} contains a NUL character. Fix: pass a real path.")
    if len(path) > MAX_PATH:
        raise ValueError(f"{what} is longer than {MAX_PATH} characters")
    if path.startswith("/"):
        raise ValueError(
            f"{what} {path!r} is absolute. Fix: give a path relative to the project root, "
            f"e.g. {path.lstrip('/') or 'src/main.py'!r}."
        )
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ValueError(
            f"{what} {path!r} contains '..'. Fix: give a path inside the project, relative to "
            "its root."
        )
    if any(part.lower() == ".git" for part in parts):
        raise ValueError(
            f"{what} {path!r} is inside a .git folder. Fix: tools never change git's own "
            "files; use the git tools instead."
        )
    if not parts:
        if allow_root:
            return "."
        raise ValueError(f"{what} is empty. Fix: name a file relative to the project root.")
    return "/".join(parts)


def link_stays_inside(rel: str, target: str) -> bool:
    """Whether a symbolic link at ``rel`` with ``target`` resolves inside the root.

    Only relative targets of the form ``../../down/to/x`` are accepted (every ``..``
    first), not climbing above the root nor into ``.git``: once the ``..`` steps are
    done the rest only descends, so even links through other accepted links cannot
    leave the root (``d/../x`` is refused: ``d`` could itself be a link to ``.``).
    """
    if not target or target.startswith("/") or "\x00" in target:
        return False
    parts = [part for part in target.split("/") if part not in ("", ".")]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    if ".." in parts[ups:] or any(part.lower() == ".git" for part in parts[ups:]):
        return False
    folder = [part for part in rel.split("/")[:-1] if part not in ("", ".")]
    return ups <= len(folder)
