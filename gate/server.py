"""The engine gate's socket: L1's only way to the container engine (stdlib only).

One thread per connection and one request per connection: the request is checked
(:mod:`gate.rules`), sent to the engine with ``Connection: close`` and the engine's answer
relayed byte for byte (streamed logs and waits included).  A refusal is an HTTP 403 whose
``message`` says what and why (the engine SDK in L1 raises it as an API error), and one
JSON line in the gate's log, which ``fluffy doctor`` shows.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from fluffy.gate import net, rules, wire

MAX_BODY = 4 * 1024 * 1024
MAX_CONNECTIONS = 128  # at once: the kernel's waits and log streams, one per sandbox
MAX_LOG = 1024 * 1024  # refusals beyond this are counted, not written
FIX = "fluffy's kernel never asks this; if it did, report it (`fluffy doctor` lists refusals)"


class Gate(net.Bounded):
    def __init__(self, path: Path, engine_socket: str, scope: rules.Scope, log: Path) -> None:
        self.engine_socket, self.scope, self.log = engine_socket, scope, log
        self.refusals, self._lock = 0, threading.Lock()
        self.dialler: net.Dialler | None = None  # L1's way out (fluffy.gate.net)
        super().__init__(path, _Handler, MAX_CONNECTIONS)

    def shutdown(self) -> None:
        if self.dialler is not None:  # both at once: each waits up to its poll interval
            threading.Thread(target=self.dialler.shutdown).start()
        super().shutdown()

    def ask(self, method: str, path: str, body: bytes = b"") -> tuple[bytes, int, Any]:
        data, status, answer = wire.request(self.engine_socket, method, path, body)
        return data, status, wire.as_json(answer)

    def owns(self, ref: str) -> tuple[bool, int]:
        """Whether ``ref`` names one of this project's containers (and the engine's status)."""
        if ref in self.scope.owned:
            return True, 200
        _, status, found = self.ask("GET", f"/containers/{ref}/json")
        if status != 200 or not isinstance(found, dict):
            return False, status
        labels = (found.get("Config") or {}).get("Labels") or {}
        mine = labels.get(rules.PROJECT_LABEL) == self.scope.project_id
        if mine:
            with self._lock:
                self.scope.owned.add(str(found.get("Id")))
        return mine, status

    def refused(self, method: str, path: str, why: str) -> None:
        entry = {"at": time.time(), "method": method, "path": path[:300], "why": why[:500]}
        with self._lock:
            self.refusals += 1
            with contextlib.suppress(OSError), self.log.open("a") as out:
                if out.tell() < MAX_LOG:
                    out.write(json.dumps(entry) + "\n")


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Gate
    protocol_version = "HTTP/1.1"
    timeout = 60  # a request that stalls this long is dropped (the relay then blocks)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # refusals go to the gate's log; allowed calls are the kernel's to audit

    def _send(self, status: int, message: str) -> None:
        data = json.dumps({"message": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _serve(self) -> None:
        self.close_connection = True
        gate, method, path = self.server, self.command, self.path
        try:
            body = self._body()
            kind, ref = rules.route(method, path)
            if body and kind != "create":  # old APIs read a HostConfig sent to start
                raise rules.Refused(f"a body of {len(body)} bytes: only a create carries one")
            if kind == "list":
                path = rules.force_label(path, gate.scope.project_id)
            elif kind == "own" and ref is not None:
                mine, status = gate.owns(ref)
                if status == 404:
                    self._send(404, f"No such container: {ref}")
                    return
                if not mine:
                    raise rules.Refused(f"container {ref} is not one of this project's sandboxes")
            elif kind == "create":
                self._create(path, body)
                return
        except rules.Refused as exc:
            gate.refused(method, path, str(exc))
            self._send(403, f"fluffy's engine gate refused {method} {path}: {exc} ({FIX})")
            return
        except OSError as exc:
            self._send(502, f"fluffy's engine gate could not reach the engine: {exc}")
            return
        self._relay(method, path, body)

    do_GET = do_POST = do_DELETE = do_HEAD = do_PUT = _serve

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise rules.Refused("chunked request bodies are not accepted")
        length = self.headers.get("Content-Length") or "0"  # digits only: int() takes 1_0
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY:
            raise rules.Refused(f"a request body of {length[:30]!r} bytes")
        return self.rfile.read(int(length))

    def _create(self, path: str, body: bytes) -> None:
        gate = self.server
        data, status, created = gate.ask("POST", path, rules.create_body(body, gate.scope))
        if status == 201 and isinstance(created, dict) and created.get("Id"):
            with gate._lock:
                gate.scope.owned.add(str(created["Id"]))
        self.wfile.write(data)

    def _relay(self, method: str, path: str, body: bytes) -> None:
        kind = self.headers.get("Content-Type") or "application/json"
        with wire.send(self.server.engine_socket, method, path, body, content_type=kind) as sock:
            while chunk := sock.recv(65536):
                self.wfile.write(chunk)


def serve(folder: Path, engine_socket: str, scope: rules.Scope, log: Path) -> Gate:
    """Start the gate on ``folder/engine.sock`` and its dialler on ``folder/net.sock`` (a
    folder L1 sees read-only); the dialler's allow-list is ``folder/../net.json``."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    gate = Gate(folder / "engine.sock", engine_socket, scope, log)
    gate.dialler = net.Dialler(folder / "net.sock", folder.parent / "net.json", gate.refused)
    for name, server in (("engine.sock", gate), ("net.sock", gate.dialler)):
        (folder / name).chmod(0o600)
        # polled every 50 ms: a stop (the bootstrap's shutdown) waits no longer than that
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return gate


def start_for(folder: Path, project: str, project_id: str, kind: str, engine_socket: str,
              writable: tuple[Path, ...], owner: int | None = None) -> Gate:  # fmt: skip
    """The bootstrap's call: a project's gate in ``folder`` (its socket and its log beside).
    ``owner``: the kernel's uid when the bootstrap runs as root (it must connect)."""
    profiles = Path(__file__).resolve().parent.parent / "seccomp" / "generated"
    scope = rules.Scope(project_id, Path(os.path.realpath(project)),
                        tuple(Path(os.path.realpath(w)) for w in writable),
                        rules.load_profiles(profiles), kind,
                        userns=wire.userns(engine_socket) if kind == "podman" else {})  # fmt: skip
    gate = serve(folder, engine_socket, scope, folder.parent.with_suffix(".gate.log"))
    if owner is not None:
        for path in (folder, folder / "engine.sock", folder / "net.sock"):
            os.chown(path, owner, owner)
    return gate
