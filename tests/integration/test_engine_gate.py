"""Code inside L1, as the kernel's own user, goes for the engine and is refused.

L1 has no engine socket; the gate's socket answers only what the kernel uses, only on
this project's sandboxes, and a create only in the hardened template.  Each attempt is
made from inside the running L1 container (``<engine> exec``), on Docker and Podman,
and must come back 403 with the refusal in the gate's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from typing import Any

from tests.integration.test_l1_kernel import FLUFFY, _fluffy, _inspect, l1  # noqa: F401 (fixture)

#: Run inside L1: one HTTP request to the gate; prints {"status": ..., "body": ...}.
PROBE = textwrap.dedent(
    """
    import http.client, json, socket, sys
    class Unix(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect("/fluffy/gate/engine.sock")
    conn = Unix("localhost", timeout=30)
    conn.request(sys.argv[1], sys.argv[2], body=sys.argv[3].encode() or None,
                 headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    body = answer.read().decode(errors="replace")
    print(json.dumps({"status": answer.status, "body": body}))
    """
)


def _in_l1(kit: dict[str, Any], container: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kit["cli"], "exec", container, *argv], capture_output=True, text=True, timeout=60
    )


def _ask(kit: dict[str, Any], container: str, method: str, path: str, body: Any = "") -> Any:
    payload = body if isinstance(body, str) else json.dumps(body)
    done = _in_l1(kit, container, "python3", "-c", PROBE, method, path, payload)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _template(kit: dict[str, Any], image: str, **host: Any) -> dict[str, Any]:
    """The hardened sandbox body the kernel sends (what the gate accepts), plus ``host``."""
    from fluffy.seccomp.compile import oci_json

    state = str(kit["paths"]["state"])
    config = {
        "Binds": [f"{kit['project']}:/workspace:ro", f"{state}:/output:rw"],
        "Tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,size=64m"},
        "Memory": 64 * 2**20, "MemorySwap": 64 * 2**20, "NanoCpus": 10**9, "PidsLimit": 10,
        "NetworkMode": "none", "ReadonlyRootfs": True, "CapDrop": ["ALL"], "IpcMode": "private",
        "SecurityOpt": ["no-new-privileges:true", f"seccomp={oci_json('strict')}"],
    }  # fmt: skip
    config.update(host)
    return {"Image": image, "User": "10001:10001", "Cmd": ["true"], "NetworkDisabled": True,
            "Labels": {}, "HostConfig": config}  # fmt: skip


def _smuggle(kit: dict[str, Any], container: str, image: str, made: str) -> int:
    """Bodies and paths that the engine reads otherwise than a naive check would, sent from
    inside L1: each a 403 with its line in the gate's log, and no container made or
    changed.  ``made``: one of the project's sandboxes, created (not started) by the gate.
    Returns how many refusals were logged."""
    valid = json.dumps(_template(kit, image))

    def then(keys: str) -> str:  # the valid body with ``keys`` appended
        return f"{valid[:-1]}, {keys}}}"

    weak = json.dumps({"NetworkMode": "bridge", "Privileged": True, "Binds": ["/:/host:rw"]})
    # Python keeps "\udcff" as the byte 0xff, Go reads U+FFFD: L1 plants a link named so
    state = kit["paths"]["state"]
    os.mkdir(bytes(state) + b"/esc\xff")
    (state / "esc\ufffd").symlink_to("/")
    escape = _template(kit, image, Binds=[f"{state}/esc\udcff:/host:rw"])
    hostile = {"Privileged": True, "Binds": ["/:/host:rw"], "CapAdd": ["ALL"]}
    create = "/v1.41/containers/create"
    table = [  # (method, path, body, what the refusal says)
        # the red team's: Docker folds key case and keeps the last one: HostConfig null
        ("POST", create, then('"hostconfig": null, "networkdisabled": false'), "repeated"),
        ("POST", create, then(f'"HOSTCONFIG": {weak}'), "repeated"),
        ("POST", create, then('"Image": "debian:bookworm-slim"'), "repeated"),
        ("POST", create, then('"Entrypoint": null, "Privileged": false'), "Entrypoint"),
        ("POST", create, json.dumps(escape), "surrogate"),
        ("POST", "/v1.40/containers/create", valid, "older"),
        # Docker before API 1.24 applies a HostConfig sent to start
        ("POST", f"/v1.23/containers/{made}/start", json.dumps(hostile), "older"),
        ("POST", f"/v1.41/containers/{made}/start", json.dumps(hostile), "only a create"),
        ("GET", "/v1.41/images/../containers/json", "", "plain path"),
        ("GET", "/v1.41/images/%2e%2e/containers/json?all=1", "", "plain path"),
        ("GET", "/v1.41/v1.41/containers/json", "", "plain path"),
        ("GET", '/v1.41/containers/json?all=1&Filters={"status":["created"]}', "", "lower case"),
    ]  # fmt: skip
    label = f"label=org.fluffy.project={kit['paths']['base'].name}"
    listed = [kit["cli"], "ps", "-a", "-q", "--no-trunc", "--filter", label]
    before = subprocess.run(listed, capture_output=True, text=True, check=True).stdout
    log = kit["paths"]["base"].with_suffix(".gate.log")
    for method, path, body, said in table:
        answer = _ask(kit, container, method, path, body)
        assert answer["status"] == 403 and said in answer["body"], (path, body[-80:], answer)
        entry = json.loads(log.read_text().splitlines()[-1])
        assert (entry["method"], entry["path"]) == (method, path) and said in entry["why"], entry
    assert subprocess.run(listed, capture_output=True, text=True, check=True).stdout == before
    found = _inspect(kit["cli"], made)
    assert found["State"]["Status"] in ("created", "configured"), found["State"]
    assert found["HostConfig"]["Privileged"] is False and not found["HostConfig"].get("CapAdd")
    return len(table)


def test_code_in_l1_cannot_reach_past_the_gate(l1: dict[str, Any]) -> None:  # noqa: F811
    started = _fluffy(l1, "start")
    assert started.returncode == 0, started.stdout + started.stderr
    container = json.loads(_fluffy(l1, "status").stdout)["container_id"]
    kernel = _inspect(l1["cli"], container)
    assert not any("docker.sock" in b or "podman.sock" in b for b in kernel["HostConfig"]["Binds"])
    # no engine socket anywhere L1 can see
    found = _in_l1(l1, container, "sh", "-c", "ls /var/run/docker.sock /run/podman 2>&1; true")
    assert "No such file" in found.stdout, found.stdout
    listed = _ask(l1, container, "GET", "/v1.41/images/json")
    assert listed["status"] == 200
    tags = [t for i in json.loads(listed["body"]) for t in i.get("RepoTags") or []]
    image = next(t.removeprefix("docker.io/") for t in tags if "fluffy/code-executor:" in t)
    # a foreign container, made on the host: L1 may neither see nor touch it
    foreign = subprocess.run(
        [l1["cli"], "create", "--label", "owner=someone-else", image, "true"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        host = str(l1["home"].parent)
        attempts = {
            "privileged": _template(l1, image, Privileged=True),
            "host root": _template(l1, image, Binds=["/:/host:rw"]),
            "project rw": _template(l1, image, Binds=[f"{l1['project']}:/workspace:rw"]),
            "outside": _template(l1, image, Binds=[f"{host}:/x:ro"]),
            "cap add": _template(l1, image, CapAdd=["SYS_ADMIN"]),
            "host pid": _template(l1, image, PidMode="host"),
            "host network": _template(l1, image, NetworkMode="host"),
            "userns host": _template(l1, image, UsernsMode="host"),
            "device": _template(l1, image, Devices=[{"PathOnHost": "/dev/sda"}]),
            "no seccomp": _template(l1, image, SecurityOpt=["no-new-privileges:true"]),
            "unconfined": _template(
                l1, image, SecurityOpt=["no-new-privileges:true", "seccomp=unconfined"]
            ),
            "unmasked proc": _template(l1, image, MaskedPaths=[]),
            "no limits": _template(l1, image, Memory=0),
            "writable root": _template(l1, image, ReadonlyRootfs=False),
            "foreign image": dict(_template(l1, image), Image="debian:bookworm-slim"),
            "root user": dict(_template(l1, image), User="0:0"),
        }
        for what, body in attempts.items():
            answer = _ask(l1, container, "POST", "/v1.41/containers/create", body)
            assert answer["status"] == 403, (what, answer)
            assert "fluffy's engine gate refused" in answer["body"], (what, answer)
        operations = [
            ("POST", f"/v1.41/containers/{foreign}/start"),
            ("DELETE", f"/v1.41/containers/{foreign}?force=1"),
            ("GET", f"/v1.41/containers/{foreign}/json"),
            ("POST", f"/v1.41/containers/{foreign}/exec"),
            ("POST", f"/v1.41/containers/{container}/exec"),  # L1 itself: not a sandbox
            ("POST", f"/v1.41/containers/{container}/kill"),
            ("POST", "/v1.41/images/create?fromImage=alpine&tag=latest"),
            ("POST", "/v1.41/build?t=evil"),
            ("POST", f"/v1.41/commit?container={foreign}&repo=fluffy/kernel&tag=0"),
            ("GET", f"/v1.41/containers/{foreign}/archive?path=/"),
            ("POST", "/v4.0.0/libpod/containers/create"),
            ("POST", "/v1.41/volumes/create"),
        ]
        for method, path in operations:
            answer = _ask(l1, container, method, path)
            assert answer["status"] == 403, (method, path, answer)
        # listing shows this project's sandboxes only (the foreign one is filtered out)
        listed = _ask(l1, container, "GET", "/v1.41/containers/json?all=1")
        assert foreign not in listed["body"]
        # the template itself is accepted: the gate refuses deviations, not the work
        accepted = _ask(l1, container, "POST", "/v1.41/containers/create", _template(l1, image))
        assert accepted["status"] == 201, accepted
        made = json.loads(accepted["body"])["Id"]
        labels = _inspect(l1["cli"], made)["Config"]["Labels"]
        assert labels["org.fluffy.project"] == kernel["Config"]["Labels"]["fluffy.project"]
        smuggled = _smuggle(l1, container, image, made)
        assert _ask(l1, container, "DELETE", f"/v1.41/containers/{made}?force=1")["status"] == 204
        assert _inspect(l1["cli"], foreign)["State"]["Status"] in ("created", "configured")
    finally:
        subprocess.run([l1["cli"], "rm", "-f", foreign], capture_output=True, check=False)
    gate_log = l1["paths"]["base"].with_suffix(".gate.log").read_text().splitlines()
    log = [json.loads(line) for line in gate_log]
    assert len(log) >= len(attempts) + len(operations) + smuggled
    assert any("Privileged" in entry["why"] for entry in log)
    doctor = subprocess.run(
        [FLUFFY, "doctor", "--json"], cwd=l1["project"], env=l1["env"], capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    gate = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "engine gate")
    assert gate["status"] == "warn" and gate["data"]["refused"] == len(log), gate


#: Run inside L1: direct connections fail (network none); the gate's dialler answers.
NET_PROBE = textwrap.dedent(
    """
    import errno, json, socket, sys
    from fluffy.kernel.net.dial import DialRefused, gate_dial
    port, other, outside = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    found = {}
    for name, where in (("loopback", ("127.0.0.1", port)), ("outside", (outside, 80))):
        with socket.socket() as sock:
            sock.settimeout(10)
            found[name] = errno.errorcode.get(sock.connect_ex(where), "connected")
    sock = gate_dial("/fluffy/gate/net.sock", "127.0.0.1", port, 10)
    sock.sendall(b"GET /through-the-gate HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
    found["gate"] = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
    for name, host, to in (("other", "127.0.0.1", other), ("public", "example.com", 443)):
        try:
            gate_dial("/fluffy/gate/net.sock", host, to, 10).close()
            found[name] = "connected"
        except DialRefused as exc:
            found[name] = "refused: " + str(exc)
    print(json.dumps(found))
    """
)


def test_l1_has_no_network_and_reaches_only_allow_listed_targets(l1: dict[str, Any]) -> None:  # noqa: F811
    """A model server on the host's loopback, allow-listed: a real turn reaches it from
    `fluffy "task"`; code in L1 cannot connect anywhere itself, and the gate dials only
    the allow-listed host:port."""
    from benchmarks._proxy import loopback_server
    from tests.fakes.llm import FakeOpenAIServer, Reply

    words = "Hello from a model on the host's loopback."
    with FakeOpenAIServer([Reply(words)]) as model, loopback_server() as other:
        port = int(model.base_url.rsplit(":", 1)[1].split("/")[0])
        policy = l1["project"] / ".fluffy" / "policy.yaml"
        policy.write_text(policy.read_text() + f"\nnetwork_whitelist: ['127.0.0.1:{port}']\n")
        said = subprocess.run(
            [FLUFFY, "say hello", "--base-url", model.base_url, "--model", "m", "--yes",
             "--project", str(l1["project"])],
            env=l1["env"], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert said.returncode == 0, said.stdout[-3000:] + said.stderr[-2000:]
        assert words in said.stdout and len(model.requests) == 1
        started = _fluffy(l1, "start")
        assert started.returncode == 0, started.stdout + started.stderr
        container = json.loads(_fluffy(l1, "status").stdout)["container_id"]
        assert _inspect(l1["cli"], container)["HostConfig"]["NetworkMode"] == "none"
        done = _in_l1(l1, container, "python3", "-c", NET_PROBE, str(port), str(other), "8.8.8.8")
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout)
    assert found["loopback"] == "ECONNREFUSED"  # L1's own loopback: the host's is not there
    assert found["outside"] == "ENETUNREACH"  # no route out at all
    assert found["gate"].startswith("HTTP/1.") and "BaseHTTP" in found["gate"]  # the host's server
    assert "not in the network allow-list" in found["other"]
    assert "not in the network allow-list" in found["public"]
    gate_log = l1["paths"]["base"].with_suffix(".gate.log").read_text().splitlines()
    refused = [json.loads(line)["path"] for line in gate_log]
    assert f"127.0.0.1:{other}" in refused and "example.com:443" in refused
