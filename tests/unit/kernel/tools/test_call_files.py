"""A call's output files: sent by the plugin host, written by the kernel into its own folder.

The sandbox's /output is its own tmpfs; the kernel reads only what it wrote itself from
``tool.files`` frames (kernel/tools/sandbox/callfiles.py, plugins/sdk/ship.py).  Hostile frames:
paths out of the folder, gaps, repeats, more than the cap, a second connection.
"""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import InvalidPayload
from fluffy.ipc.client import SyncClient
from fluffy.kernel.tools.sandbox import callfiles
from fluffy.kernel.tools.sandbox.callfiles import FilesParams, Received, parse_files, write_files
from fluffy.kernel.tools.sandbox.pluginsocket import PluginSocket
from fluffy.plugins.sdk import ship
from tests.unit.plugin_socket_support import plugin_call

pytestmark = pytest.mark.unit


def piece(path: str, data: bytes, offset: int = 0) -> dict[str, Any]:
    return {"path": path, "offset": offset, "data": base64.b64encode(data).decode()}


FILES = PluginSocket({}, None).methods("demo").syscall("tool.files")
assert FILES is not None


def frame_of(call_id: str, pieces: list[dict[str, Any]]) -> FilesParams:
    """A ``tool.files`` frame as the socket decodes it (strictly: InvalidPayload)."""
    decoded: FilesParams = FILES.decode({"call_id": call_id, "files": pieces})
    return decoded


def receive(folder: Path, *frames: list[dict[str, Any]]) -> Received:
    received = Received()
    for frame in frames:
        write_files(folder, parse_files(frame_of("c1", frame), "c1"), received)
    return received


def test_the_hosts_frames_rebuild_every_regular_file_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "output"
    (out / "reports" / "deep").mkdir(parents=True)
    big = os.urandom(ship.FRAME_BYTES * 2 + 123)  # three frames
    (out / "reports" / "junit.xml").write_bytes(big)
    (out / "reports" / "deep" / "empty").write_bytes(b"")
    (out / "a.txt").write_text("a\n")
    (out / "link").symlink_to("/etc/passwd")  # never followed, never sent
    os.mkfifo(out / "fifo")  # not a regular file
    frames = list(ship.frames(out))
    assert len(frames) >= 3 and all(
        sum(len(base64.b64decode(p["data"])) for p in f) <= ship.FRAME_BYTES for f in frames
    )
    kernel = tmp_path / "kernel"
    received = receive(kernel, *frames)
    assert (kernel / "reports" / "junit.xml").read_bytes() == big
    assert (kernel / "reports" / "deep" / "empty").read_bytes() == b""
    assert (kernel / "a.txt").read_text() == "a\n"
    assert not (kernel / "link").exists() and not (kernel / "fifo").exists()
    assert received.files == 5  # three files, two folders
    assert len(big) + 2 <= received.bytes <= len(big) + 2 + 2 * len(frames)  # before decoding
    assert list(ship.frames(tmp_path / "absent")) == []


@pytest.mark.parametrize(
    ("frame", "said"),
    [
        ([piece("../escape", b"x")], "refused"),
        ([piece("/etc/passwd", b"x")], "refused"),
        ([piece("a/../../b", b"x")], "refused"),
        ([piece("bad\x1bname", b"x")], "refused"),
        ([piece("/".join(["d"] * 40), b"x")], "components"),
        ([piece("x" * 2000, b"x")], "characters"),
        ([{"path": "a", "offset": -1, "data": ""}], "offset"),
        ([{"path": "a", "offset": True, "data": ""}], "offset"),
        ([{"path": "a", "offset": 0, "data": "not base64!"}], "base64"),
        ([{"path": "a", "offset": 0}], "data"),
        ([], "1 to"),
    ],
)
def test_malformed_pieces_are_refused_and_nothing_is_written(
    tmp_path: Path, frame: list[dict[str, Any]], said: str
) -> None:
    with pytest.raises(InvalidPayload, match=said):
        receive(tmp_path / "kernel", frame)
    assert not (tmp_path / "kernel").exists() and not (tmp_path / "escape").exists()


def test_gaps_repeats_links_and_the_cap_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = tmp_path / "kernel"
    receive(kernel, [piece("a", b"12345")])
    with pytest.raises(InvalidPayload, match="gap"):
        receive(kernel, [piece("a", b"x", offset=9)])
    with pytest.raises(InvalidPayload, match="sent twice"):
        receive(kernel, [piece("a", b"again")])
    receive(kernel, [piece("a", b"678", offset=5)])  # the next piece, in order
    assert (kernel / "a").read_bytes() == b"12345678"
    os.symlink(tmp_path / "victim", kernel / "planted")  # never followed
    with pytest.raises(InvalidPayload):
        receive(kernel, [piece("planted", b"x", offset=1)])
    assert not (tmp_path / "victim").exists()
    monkeypatch.setattr(callfiles, "MAX_CALL_BYTES", 10)
    with pytest.raises(InvalidPayload, match="capped"):
        receive(kernel, [piece("b", b"x" * 11)])
    assert not (kernel / "b").exists()


def test_only_the_connection_that_took_the_call_may_send_its_files(tmp_path: Path) -> None:
    async def main() -> list[str]:
        said: list[str] = []

        def calls(sock: Path) -> None:
            frame = {"call_id": "c1", "files": [piece("junit.xml", b"<forged/>")]}
            with (
                SyncClient(str(sock), plugin_name="demo") as host,
                SyncClient(str(sock), plugin_name="demo") as intruder,
            ):
                with pytest.raises(InvalidPayload) as early:
                    intruder.call("tool.files", frame)  # before anyone took the call
                said.append(str(early.value))
                host.call("tool.next")
                with pytest.raises(InvalidPayload) as caught:
                    intruder.call("tool.files", frame)  # test code on the same socket
                said.append(str(caught.value))
                host.call("tool.files", {"call_id": "c1", "files": [piece("junit.xml", b"ok")]})
                host.call("tool.result", {"call_id": "c1", "ok": True, "result": {}})
                with pytest.raises(InvalidPayload, match="answered already"):
                    host.call("tool.files", frame)

        async with plugin_call(tmp_path) as (_, sock):
            await asyncio.to_thread(calls, sock)
        return said

    said = asyncio.run(main())
    assert all("connection that took the call" in s for s in said)
    assert (tmp_path / "out" / "c1" / "junit.xml").read_bytes() == b"ok"


def test_a_refused_frame_fails_the_call_and_folders_count(tmp_path: Path) -> None:
    async def main() -> dict[str, Any]:
        def calls(sock: Path) -> None:
            with SyncClient(str(sock), plugin_name="demo") as host:
                host.call("tool.next")
                with pytest.raises(InvalidPayload, match="never started"):
                    host.call("tool.files", {"call_id": "c1", "files": [piece("a", b"x", 5)]})
                with pytest.raises(InvalidPayload, match="refused already"):
                    host.call("tool.files", {"call_id": "c1", "files": [piece("b", b"x")]})
                host.call("tool.result", {"call_id": "c1", "ok": True, "result": {}})

        async with plugin_call(tmp_path) as (job, sock):
            await asyncio.to_thread(calls, sock)
            return await asyncio.wait_for(job.future, 5)

    reply = asyncio.run(main())
    assert reply["ok"] is False and "never started" in reply["error"]["message"]
    assert not (tmp_path / "out" / "c1" / "a").exists()  # a later piece never makes a file
    received = Received()
    deep = ["d"] * 31
    write_files(tmp_path / "k", parse_files(frame_of("c", [
        piece("/".join([*deep, "f"]), b"")]), "c"), received)  # fmt: skip
    assert received.files == 32  # 31 folders and the file count against the cap
