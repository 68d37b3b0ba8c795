"""The gate's dialler: L1 has no network, its CONNECT proxy dials here (stdlib only).

One JSON line ``{"host", "port"}`` per connection; the target must be admitted by the
allow-list written on the host (``<base>/net.json``, never seen by L1), a name resolves
here once and must be public unless an IP entry admits the address.  The answer: a JSON
line with the proxy's status (200, 400, 403, 502) and, on 200, the connected socket
(SCM_RIGHTS).  Refusals go to the gate's log.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64  # at once (the kernel's proxy allows 64 tunnels)
NAME = re.compile(r"(?=.{1,253}\Z)([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9-]{1,63}\Z")
Rule = tuple[str, int, bool]  # (host or IP text or wildcard suffix, port, wildcard)


class Refused(Exception):
    pass


def load(path: Path) -> list[Rule]:
    # none (default deny) when the file is missing or unreadable
    try:
        rules = json.loads(path.read_text())["rules"]
        return [(str(host).lower(), int(port), bool(wild)) for host, port, wild in rules]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def admits(rules: list[Rule], host: str, port: int) -> bool:
    # as the kernel's AllowList: a name rule never admits an address, nor the reverse
    ip = _ip(host)
    for name, rule_port, wildcard in rules:
        if rule_port != port:
            continue
        rule_ip = _ip(name)
        if ip is not None or rule_ip is not None:
            if ip is not None and ip == rule_ip:
                return True
        elif host.endswith("." + name) if wildcard else host == name:
            return True
    return False


#: "Global" to Python, yet carrying an IPv4 address a gateway may reach (NAT64, 6to4,
#: IPv4-compatible) or deprecated site-local: never public for the dialler.
EMBEDDING = tuple(
    ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "::/96",
                                      "fec0::/10")
)  # fmt: skip


def public(found: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return found.is_global and not any(found in net for net in EMBEDDING)


def address(rules: list[Rule], host: str, port: int) -> str:
    # an admitted IP as is; a name resolved once (public, or admitted by an IP entry)
    ip = _ip(host)
    if ip is not None:
        return str(ip)
    for *_, where in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        found = ipaddress.ip_address(where[0])
        if public(found) or admits(rules, str(found), port):
            return str(found)
    raise Refused(
        f"{host} resolves to a private or loopback address; only an IP entry in policy.yaml "
        "network_whitelist admits such an address"
    )


class Bounded(socketserver.ThreadingUnixStreamServer):
    # a thread per connection, at most `limit` at once (more are closed at once: a
    # compromised kernel cannot exhaust the host user's threads)

    daemon_threads = True
    block_on_close = False

    def __init__(self, path: Path, handler: Any, limit: int) -> None:
        self.slots = threading.BoundedSemaphore(limit)
        path.unlink(missing_ok=True)
        super().__init__(str(path), handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class Dialler(Bounded):
    def __init__(self, path: Path, rules: Path, refused: Callable[[str, str, str], None]) -> None:
        self.rules, self.refused = rules, refused
        super().__init__(path, _Handler, MAX_CONNECTIONS)


class _Handler(socketserver.StreamRequestHandler):
    server: Dialler
    timeout = TIMEOUT_S

    def handle(self) -> None:
        answer: dict[str, object] = {"status": 400, "why": "send one JSON line: host and port"}
        upstream, target = None, "?"
        try:
            ask = json.loads(self.rfile.readline(2048))
            host, port = str(ask["host"]).lower(), ask["port"]
            target = f"{host[:300]}:{port}"
            if type(port) is not int or not (0 < port < 65536 and (_ip(host) or NAME.match(host))):
                raise ValueError(target)
            rules = load(self.server.rules)
            if not admits(rules, host, port):
                raise Refused(
                    f"{target} is not in the network allow-list approved at the kernel's start "
                    "(an entry added to policy.yaml later needs your yes: `fluffy stop`, then "
                    "`fluffy start` on a terminal or `fluffy start --yes`)"
                )
            where = address(rules, host, port)
            upstream = socket.create_connection((where, port), timeout=TIMEOUT_S)
            answer = {"status": 200, "address": where}
        except Refused as exc:
            answer = {"status": 403, "why": str(exc)}
            self.server.refused("CONNECT", target, str(exc))
        except (ValueError, KeyError, TypeError, RecursionError):
            pass
        except OSError as exc:
            answer = {"status": 502, "why": f"cannot reach {target}: {exc}"}
        data = json.dumps(answer).encode() + b"\n"
        try:
            if upstream is None:
                self.request.sendall(data)
            else:
                socket.send_fds(self.request, [data], [upstream.fileno()])
        except OSError:
            pass  # the kernel went away: nothing to tell
        finally:
            if upstream is not None:
                upstream.close()
