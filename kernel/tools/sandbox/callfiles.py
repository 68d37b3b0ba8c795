"""A call's output files, received over its socket into the kernel's own call folder.

The sandbox's ``/output`` is a tmpfs of its own (sized, noexec); nothing the sandbox can
touch is ever read by the kernel.  Its plugin host sends the files it wrote
(``tool.files``, :mod:`fluffy.plugins.sdk.ship`) and the kernel writes them here, in a
folder no sandbox mounts:

* one frame at a time per call (a second one while the first is written is refused, and
  ``tool.result`` waits for the one in flight), written on a thread of its own so that
  no plugin can hold the kernel's shared worker threads;
* names checked (relative, no ``..``, no control characters, at most
  :data:`MAX_PARTS` components and :data:`MAX_NAME` characters), everything made
  beneath the call folder's open descriptor, never through a link;
* each file written in order (a piece must start where the last one ended), never
  twice; sizes are checked against :data:`MAX_CALL_BYTES` before anything is decoded,
  files and folders together against :data:`MAX_CALL_FILES`;
* a frame refused here fails the call: nothing more is accepted, and its result is
  replaced by the refusal (what the files are is the sandbox's word either way, and the
  kernel reads them as untrusted).  A frame whose params do not decode as
  :class:`FilesParams` is refused by the socket before any of it is read: it writes
  nothing, and fluffy's plugin host turns that refusal into the call's failure too.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from fluffy.errors import FluffyError, InvalidPayload
from fluffy.kernel.confined_files import relative_parts
from fluffy.kernel.containers.manager import OUTPUT_MAX_BYTES

MAX_CALL_BYTES = OUTPUT_MAX_BYTES  # the sandbox's /output tmpfs holds no more
MAX_CALL_FILES = 20_000  # files and folders
MAX_ENTRIES = 1024  # pieces per frame
MAX_PARTS = 32  # components of a name
MAX_NAME = 1024  # characters of a name

#: Call files are written here, one frame at a time for the whole kernel.
WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fluffy-callfiles")

Piece = tuple[list[str], int, str]  # (name's components, offset, data as base64)


class Received(msgspec.Struct):
    """What a call has sent so far (its folders included)."""

    bytes: int = 0
    files: int = 0
    folders: set[tuple[str, ...]] = msgspec.field(default_factory=set)


class FilePiece(msgspec.Struct, forbid_unknown_fields=True):
    """One piece of an output file: ``data`` (base64) written at ``offset`` of ``path``."""

    path: str
    offset: int
    data: str


class FilesParams(msgspec.Struct, forbid_unknown_fields=True):
    """``tool.files``: one frame of a call's output files."""

    call_id: str
    files: list[FilePiece]


def parse_files(params: FilesParams, call_id: str) -> list[Piece]:
    """The pieces of one ``tool.files`` frame, names checked, data not yet decoded."""
    if params.call_id != call_id:
        raise InvalidPayload("tool.files must name the call it belongs to (call_id)")
    if not 0 < len(params.files) <= MAX_ENTRIES:
        raise InvalidPayload(f"tool.files carries a list of 1 to {MAX_ENTRIES} pieces")
    pieces = []
    for entry in params.files:
        name, offset = entry.path, entry.offset
        if offset < 0:
            raise InvalidPayload(
                "a tool.files piece is {path, offset (an integer >= 0), data (base64)}"
            )
        try:
            parts = relative_parts(name)
        except FluffyError as exc:
            raise InvalidPayload(f"a tool.files path is refused: {exc.why or exc}") from None
        if len(parts) > MAX_PARTS or len(name) > MAX_NAME:
            raise InvalidPayload(
                f"a tool.files path has more than {MAX_PARTS} components or {MAX_NAME} characters"
            )
        pieces.append((parts, offset, entry.data))
    return pieces


def _reserve(pieces: list[Piece], received: Received) -> None:
    """Count the frame against the call's caps before anything is decoded or made."""
    size = sum(len(data) * 3 // 4 for _, _, data in pieces)
    folders = {tuple(parts[:i]) for parts, _, _ in pieces for i in range(1, len(parts))}
    new = sum(1 for _, offset, _ in pieces if offset == 0) + len(folders - received.folders)
    if received.bytes + size > MAX_CALL_BYTES or received.files + new > MAX_CALL_FILES:
        raise InvalidPayload(
            f"a call's output is capped at {MAX_CALL_BYTES // 2**20} MiB and "
            f"{MAX_CALL_FILES} files and folders"
        )
    received.bytes += size
    received.files += new
    received.folders |= folders


def _folder(root: int, parts: list[str]) -> int:
    """An open descriptor of the folder ``parts`` beneath ``root``, made if missing."""
    fd = os.dup(root)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_files(folder: Path, pieces: list[Piece], received: Received) -> None:
    """Write ``pieces`` beneath ``folder`` (the kernel's own call folder, made here if
    its parent, the sandbox's folder, still exists), within the call's caps."""
    _reserve(pieces, received)
    decoded = []
    for parts, offset, data in pieces:  # all of the frame, before anything is made
        try:
            decoded.append((parts, offset, base64.b64decode(data, validate=True)))
        except (ValueError, binascii.Error):
            raise InvalidPayload(f"output file {'/'.join(parts)!r}: data is not base64") from None
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise InvalidPayload(f"the call's folder is gone ({exc.strerror})") from None
    root = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for parts, offset, raw in decoded:
            _write_piece(root, parts, offset, raw)
    finally:
        os.close(root)


def _write_piece(root: int, parts: list[str], offset: int, raw: bytes) -> None:
    name = "/".join(parts)
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_CREAT | os.O_EXCL if offset == 0 else 0  # a later piece: an existing file
    try:
        parent = _folder(root, parts[:-1])
        try:
            fd = os.open(parts[-1], flags, 0o600, dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as exc:
        why = "sent twice" if offset == 0 else "a piece of a file never started"
        raise InvalidPayload(
            f"output file {name!r} cannot be written: {exc.strerror} ({why}, or a folder "
            "and a file of the same name?)"
        ) from None
    try:
        if os.fstat(fd).st_size != offset:
            raise InvalidPayload(f"output file {name!r}: a piece at {offset} leaves a gap")
        os.pwrite(fd, raw, offset)
    finally:
        os.close(fd)
