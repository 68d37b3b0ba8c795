"""The engine gate's rules: the hardened template passes, every deviation is refused.

(tests/integration/test_engine_gate.py makes the same attempts from inside a real L1.)
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from fluffy.gate import rules
from fluffy.seccomp.compile import oci_json

GENERATED = Path(rules.__file__).resolve().parent.parent / "seccomp" / "generated"


@pytest.fixture
def scope(tmp_path: Path) -> rules.Scope:
    for name in ("project", "state/outputs", "run"):
        (tmp_path / name).mkdir(parents=True)
    return rules.Scope(
        "abc123",
        tmp_path / "project",
        (tmp_path / "state", tmp_path / "run"),
        rules.load_profiles(GENERATED),
    )


def body(scope: rules.Scope, **host: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "Binds": [f"{scope.project}:/workspace:ro", f"{scope.writable[0]}/outputs:/staged:ro"],
        "Tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,size=64m",
                  "/output": "rw,noexec,nosuid,nodev,size=256m,mode=1777"},
        "Memory": 2**26, "MemorySwap": 2**26, "NanoCpus": 10**9, "PidsLimit": 10,
        "NetworkMode": "none", "ReadonlyRootfs": True, "CapDrop": ["ALL"], "IpcMode": "private",
        "SecurityOpt": ["no-new-privileges:true", f"seccomp={oci_json('standard')}"],
    }  # fmt: skip
    config.update(host)
    return {"Image": "fluffy/code-executor:" + "a" * 16, "User": "1000:1000", "Cmd": ["true"],
            "NetworkDisabled": True, "Tty": False, "AttachStdout": True, "Labels": {"x": "1"},
            "HostConfig": config}  # fmt: skip


def test_the_hardened_template_passes_with_the_project_label_forced(scope: rules.Scope) -> None:
    sent = body(scope)
    sent["Labels"][rules.PROJECT_LABEL] = "another-project"
    out = rules.check_create(sent, scope)
    assert out["Labels"] == {"x": "1", rules.PROJECT_LABEL: "abc123"}
    assert out["HostConfig"]["SecurityOpt"] == sent["HostConfig"]["SecurityOpt"]


def test_podman_gets_the_gates_own_profile_file(scope: rules.Scope) -> None:
    scope.engine = "podman"
    out = rules.check_create(body(scope), scope)
    assert out["HostConfig"]["SecurityOpt"] == [
        "no-new-privileges:true",
        f"seccomp={GENERATED / 'standard.json'}",
    ]


WEAK_PROFILE = json.dumps({**json.loads(oci_json("standard")), "defaultAction": "SCMP_ACT_ALLOW"})


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"Privileged": True}, "Privileged"),
        ({"CapAdd": ["SYS_ADMIN"]}, "CapAdd"),
        ({"CapDrop": []}, "CapDrop"),
        ({"NetworkMode": "host"}, "NetworkMode"),
        ({"PidMode": "host"}, "PidMode"),
        ({"UsernsMode": "host"}, "UsernsMode"),
        ({"UTSMode": "host"}, "UTSMode"),
        ({"IpcMode": "host"}, "IpcMode"),
        ({"Devices": [{"PathOnHost": "/dev/sda"}]}, "Devices"),
        ({"MaskedPaths": []}, "MaskedPaths"),
        ({"Mounts": [{"Type": "bind", "Source": "/"}]}, "Mounts"),
        ({"ReadonlyRootfs": False}, "ReadonlyRootfs"),
        ({"Memory": 0}, "Memory"),
        ({"PidsLimit": None}, "PidsLimit"),
        ({"MemorySwap": -1}, "MemorySwap"),
        ({"SecurityOpt": ["no-new-privileges:true"]}, "seccomp"),
        ({"SecurityOpt": ["no-new-privileges:true", "seccomp=unconfined"]}, "generated"),
        ({"SecurityOpt": ["no-new-privileges:true", f"seccomp={WEAK_PROFILE}"]}, "generated"),
        ({"SecurityOpt": ["seccomp=" + oci_json("strict")]}, "no-new-privileges"),
        ({"Tmpfs": {"/tmp": "rw,size=64m"}}, "noexec"),
        ({"Tmpfs": {"/etc": "rw,noexec,nosuid,nodev,size=1m"}}, "/etc"),
        ({"Tmpfs": {"/output": "rw,nosuid,nodev,size=1m,mode=1777"}}, "noexec"),
        ({"Tmpfs": {"/output": "rw,noexec,nosuid,nodev,mode=1777"}}, "sized"),
        ({"Tmpfs": {"/output": "rw,noexec,nosuid,nodev,size=1m,size=2g"}}, "sized"),
        ({"Tmpfs": {"/output": "rw,noexec,nosuid,nodev,size=1m,mode=4777"}}, "sized"),
        ({"Tmpfs": {"/output": "rw,noexec,nosuid,nodev,size=1m,exec"}}, "sized"),
        ({"Tmpfs": {"/output": "rw,noexec,nosuid,nodev,size=0"}}, "sized"),  # 0: unlimited
        ({"Tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,size=0k"}}, "sized"),
        # sizes the kernel's parser wraps to 0 (no limit), and anything over 1 GiB
        ({"Tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,size=18446744073709551616"}}, "sized"),
        ({"Tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,size=17179869184g"}}, "sized"),
        ({"Tmpfs": {"/tmp": "rw,noexec,nosuid,nodev,size=2g"}}, "sized"),
        ({"Binds": ["/:/host:rw"]}, "outside"),
        ({"Binds": ["/etc:/etc:ro"]}, "outside"),
    ],
)
def test_every_deviation_is_refused(scope: rules.Scope, change: dict[str, Any], said: str) -> None:
    with pytest.raises(rules.Refused, match=said):
        rules.check_create(body(scope, **change), scope)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"Image": "debian:bookworm-slim"}, "image"),
        ({"Image": "fluffy/kernel@sha256:" + "a" * 64}, "image"),
        ({"User": "0:0"}, "user"),
        ({"User": "root"}, "user"),
        ({"User": ""}, "user"),
        ({"NetworkDisabled": False}, "NetworkDisabled"),
        ({"Entrypoint": ["sh"]}, "Entrypoint"),
        ({"HostConfig": None}, "HostConfig"),
    ],
)
def test_the_container_config_is_checked_too(
    scope: rules.Scope, change: dict[str, Any], said: str
) -> None:
    with pytest.raises(rules.Refused, match=said):
        rules.check_create({**body(scope), **change}, scope)


def raw(scope: rules.Scope, top: str = "", host: str = "", labels: str = "") -> bytes:
    """The body of :func:`body` as JSON text, with ``top``, ``host`` and ``labels`` text
    appended to the container, its HostConfig and its Labels (as L1 could send it)."""
    sent = body(scope)
    config = json.dumps(sent.pop("HostConfig"))[:-1] + host + "}"
    tags = json.dumps(sent.pop("Labels"))[:-1] + labels + "}"
    return f'{json.dumps(sent)[:-1]}, "HostConfig": {config}, "Labels": {tags}{top}}}'.encode()


@pytest.mark.parametrize(
    ("top", "host", "labels", "said"),
    [
        # the red team's body: Docker's decoder folds case and the later key wins
        (', "hostconfig": null, "networkdisabled": false', "", "", "repeated"),
        (', "HOSTCONFIG": {"NetworkMode": "bridge"}', "", "", "repeated"),
        (', "Image": "fluffy/code-executor:' + "b" * 16 + '"', "", "", "repeated"),
        (', "image": "debian:bookworm-slim"', "", "", "repeated"),
        (', "Networ\u212adisabled": false', "", "", "repeated"),  # Kelvin sign: Go folds it
        ("", ', "networkmode": "host"', "", "repeated"),
        ("", ', "Memory": 0', "", "repeated"),
        ("", ', "SECURITYOPT": []', "", "repeated"),
        ("", "", ', "x": "2"', "repeated"),  # labels are data, but never two of one name
        ("", "", ', "X": "2"', "repeated"),
        # keys outside the template, whatever their value
        (', "Entrypoint": null', "", "", "Entrypoint is set"),
        (', "Hostname": ""', "", "", "Hostname is set"),
        (', "Volumes": {}', "", "", "Volumes is set"),
        (', "StopTimeout": 0', "", "", "StopTimeout is set"),
        (', "NetworkingConfig": {"EndpointsConfig": {}}', "", "", "NetworkingConfig is set"),
        (', "Privileged": true', "", "", "Privileged is set"),  # a HostConfig key, one up
        ("", ', "privileged": false', "", "privileged is set"),
        ("", ', "CapAdd": null', "", "CapAdd is set"),
        ("", ', "CapAdd": []', "", "CapAdd is set"),
        ("", ', "PidMode": ""', "", "PidMode is set"),
        ("", ', "MaskedPaths": null', "", "MaskedPaths is set"),
        ("", ', "LogConfig": {"Type": "none"}', "", "LogConfig is set"),
        (', "OpenStdin": 0', "", "", "OpenStdin 0 is not False"),  # 0 is not false to Go
        ("", "", ', "y": {"nested": "map"}', "type"),
        ("", "", ', "y": 1', "type"),
    ],
)
def test_keys_are_matched_as_the_engine_matches_them(
    scope: rules.Scope, top: str, host: str, labels: str, said: str
) -> None:
    assert rules.create_body(raw(scope), scope)  # the template itself passes
    with pytest.raises(rules.Refused, match=said):
        rules.create_body(raw(scope, top, host, labels), scope)


@pytest.mark.parametrize(
    ("top", "host", "said"),
    [
        ({"Tty": True}, {}, "Tty True is not False"),
        ({"Cmd": "sh -c id"}, {}, "type"),
        ({"Env": None}, {}, "type"),
        ({"Labels": []}, {}, "type"),
        ({"User": 1000}, {}, "type"),
        ({}, {"Init": None}, "Init None is not False"),
        ({}, {"IpcMode": "host"}, "IpcMode 'host' is not 'private'"),
        ({}, {"Binds": [1]}, "type"),
        ({}, {"Binds": "/:/host:rw"}, "type"),
        ({}, {"Tmpfs": {"/tmp": ["rw"]}}, "type"),
        ({}, {"Memory": 2.0**26, "MemorySwap": 2.0**26}, "type"),
        ({}, {"PidsLimit": True}, "type"),  # true is not 1 to Go
    ],
)
def test_template_keys_hold_their_type_and_value(
    scope: rules.Scope, top: dict[str, Any], host: dict[str, Any], said: str
) -> None:
    with pytest.raises(rules.Refused, match=said):
        rules.check_create({**body(scope, **host), **top}, scope)


def test_a_key_in_another_case_is_the_engines_key_and_goes_on_canonical(
    scope: rules.Scope,
) -> None:
    """One key in any case is what the engine reads: checked as that key, sent spelt
    as the template spells it, and the fixed values sent whether L1 sent them or not."""
    sent = body(scope)
    sent["hostconfig"] = {k.upper(): v for k, v in sent.pop("HostConfig").items()}
    sent["NETWORKDISABLED"] = sent.pop("NetworkDisabled")
    out = json.loads(rules.create_body(json.dumps(sent).encode(), scope))
    assert out == json.loads(rules.create_body(raw(scope), scope))
    assert set(out) == set(rules.TOP) - {"Env", "WorkingDir"}
    assert set(out["HostConfig"]) == set(rules.HOST)
    assert out["HostConfig"]["Init"] is False and out["AttachStdin"] is False
    weak = dict(sent, hostconfig=dict(sent["hostconfig"], NETWORKMODE="host"))
    with pytest.raises(rules.Refused, match="NetworkMode 'host' is not 'none'"):
        rules.create_body(json.dumps(weak).encode(), scope)


@pytest.mark.parametrize(
    "text", [b"", b"[]", b"null", b"{", b'{"Image": NaN}', b"[" * 100_000, b"\xff{}"]
)
def test_a_body_that_is_no_json_object_is_refused(scope: rules.Scope, text: bytes) -> None:
    with pytest.raises(rules.Refused, match=r"JSON|type"):
        rules.create_body(text, scope)


def test_a_lone_surrogate_that_the_engine_would_read_as_another_path_is_refused(
    scope: rules.Scope,
) -> None:
    """Python keeps "\udcff" as a byte of a path (0xff), Go reads it as U+FFFD: the gate
    would check one folder and the engine mount another, a link L1 planted to /."""
    state = scope.writable[0]
    os.mkdir(bytes(state) + b"/esc\xff")
    (state / "esc\ufffd").symlink_to("/")
    sent = raw(scope).replace(
        b'"Binds": [', b'"Binds": ["' + str(state).encode() + b'/esc\\udcff:/x:rw", '
    )
    with pytest.raises(rules.Refused, match="surrogate"):
        rules.create_body(sent, scope)
    with pytest.raises(rules.Refused, match="surrogate"):
        rules.create_body(raw(scope, labels=', "y": "\\ud800"'), scope)
    paired = rules.create_body(raw(scope, labels=', "y": "\\ud83d\\ude00"'), scope)  # one emoji
    assert json.loads(paired)["Labels"]["y"] == "\U0001f600"


def test_the_body_the_kernel_sends_passes_key_for_key(
    scope: rules.Scope, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's own create (DockerRuntime, the docker SDK) is the template: every key
    it sends is admitted with its value, and nothing else is forwarded."""
    import docker

    from fluffy.errors import FluffyError
    from fluffy.kernel.containers.docker_runtime import DockerRuntime
    from fluffy.kernel.containers.runtime import ContainerSpec, Mount

    api, sent = docker.APIClient(base_url="unix:///nowhere", version="1.41"), []

    def post(url: str, **kwargs: Any) -> Any:
        sent.append(kwargs["data"])
        raise docker.errors.APIError("captured")

    monkeypatch.setattr(api, "_post", post, raising=False)
    spec = ContainerSpec(
        "fluffy-code-executor-1", "fluffy/code-executor:" + "c" * 16, ["python3", "-m", "x"],
        {"org.fluffy.managed": "1", rules.PROJECT_LABEL: "abc123"},
        (Mount(scope.project, "/workspace"), Mount(scope.writable[0] / "outputs", "/staged")),
        "/workspace", {"HOME": "/tmp"}, seccomp_json=oci_json("standard"), user="10000:10000",
        tmpfs={"/tmp": "rw,noexec,nosuid,nodev,size=64m"},
    )  # fmt: skip
    with pytest.raises(FluffyError, match="captured"):
        DockerRuntime(type("Client", (), {"api": api})()).create(spec)
    out = json.loads(rules.create_body(sent[0].encode(), scope))
    assert out == json.loads(sent[0])
    assert set(out) == set(rules.TOP) and set(out["HostConfig"]) == set(rules.HOST)


def test_the_project_is_mounted_read_only_only(scope: rules.Scope) -> None:
    with pytest.raises(rules.Refused, match="read-only"):
        rules.check_create(body(scope, Binds=[f"{scope.project}:/workspace:rw"]), scope)


def test_a_link_planted_in_fluffys_folders_does_not_lead_the_mount_out(
    scope: rules.Scope, tmp_path: Path
) -> None:
    (scope.writable[0] / "escape").symlink_to("/")
    with pytest.raises(rules.Refused, match="outside"):
        rules.check_create(body(scope, Binds=[f"{scope.writable[0]}/escape:/x:rw"]), scope)
    inside = scope.writable[0] / "in"
    inside.symlink_to(scope.writable[0] / "outputs")
    out = rules.check_create(body(scope, Binds=[f"{inside}:/output:rw"]), scope)
    assert out["HostConfig"]["Binds"] == [f"{scope.writable[0] / 'outputs'}:/output:rw"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1.41/containers/abc/exec"),
        ("POST", "/v1.41/exec/abc/start"),
        ("POST", "/v1.41/images/create"),
        ("POST", "/v1.41/build"),
        ("POST", "/v1.41/commit?container=abc"),
        ("GET", "/v1.41/containers/abc/archive?path=/"),
        ("PUT", "/v1.41/containers/abc/archive?path=/"),
        ("POST", "/v1.41/containers/abc/attach"),
        ("POST", "/v1.41/containers/abc/update"),
        ("POST", "/v1.41/containers/abc/rename?name=x"),
        ("POST", "/v1.41/volumes/create"),
        ("DELETE", "/v1.41/images/fluffy/kernel:abc"),
        ("POST", "/v1.41/networks/create"),
        ("POST", "/v1.41/plugins/pull"),
    ],
)
def test_operations_the_kernel_never_uses_are_refused(method: str, path: str) -> None:
    with pytest.raises(rules.Refused, match="not an operation"):
        rules.route(method, path)


@pytest.mark.parametrize(
    ("method", "path", "said"),
    [
        ("GET", "/v1.41/images/../containers/json", "plain"),  # Docker: 301, by luck
        ("GET", "/v1.41/containers/../../_ping", "plain"),
        ("GET", "/v1.41/images/./containers/json", "plain"),
        ("GET", "/v1.41/images/fluffy/kernel:abc/./json", "plain"),
        ("GET", "/v1.41/images/fluffy/kernel:abc/..", "plain"),
        ("GET", "/v1.41//containers/json", "plain"),
        ("GET", "//v1.41/containers/json", "plain"),
        ("GET", "/v1.41/images/%2e%2e/containers/json", "plain"),
        ("GET", "/v1.41/images/fluffy%2fkernel:abc/json", "plain"),
        ("GET", "/v1.41/containers%2fjson", "plain"),
        ("GET", "/v1.41/images\\..\\containers/json", "plain"),
        ("GET", "/v1.41/v1.41/containers/json", "plain"),
        ("GET", "/v1.41/v1.40/containers/json", "plain"),
        ("POST", "/v4.0.0/libpod/containers/create", "plain"),
        ("POST", "/v1/containers/create", "plain"),
        ("GET", "/v1.41/containers/json;all=1", "operation"),
        ("GET", "/v1.41/containers/json?all=1;filters={}", "plain"),
        ("GET", "/v1.41/containers/json?filters={}&filters={}", "repeated"),
        ("GET", '/v1.41/containers/json?Filters={"label":["a"]}', "lower case"),
        ("GET", '/v1.41/volumes?FILTERS={"name":["a"]}', "lower case"),
        ("GET", "/v1.41/containers/json?all=1&all=0", "repeated"),
        ("POST", "/v1.41/containers/create?name=a&Name=b", "lower case"),
        ("GET", "/v1.41/containers/json?%66ilters={}&filters={}", "repeated"),  # %-decoded
        ("GET", "http://engine/v1.41/containers/json", "plain"),
        # before 1.24 Docker applies a HostConfig sent to start; before 1.41 other defaults
        ("POST", "/v1.23/containers/abc/start", "older"),
        ("POST", "/v1.40/containers/create", "older"),
        ("GET", "/v1.12/containers/json", "older"),
        ("GET", "/v0.41/_ping", "older"),
        ("GET", "/v1.41/images/fluffy/x/json/../../../containers/json", "plain"),
        ("GET", "/v1.41/Containers/json", "operation"),
    ],
)
def test_paths_are_refused_unless_plain(method: str, path: str, said: str) -> None:
    with pytest.raises(rules.Refused, match=said):
        rules.route(method, path)


def test_a_list_filter_with_a_repeated_key_is_refused() -> None:
    for filters in ('{"label": ["a=1"], "label": []}', '{"label": ["a=1"], "LABEL": []}'):
        with pytest.raises(rules.Refused, match="repeated"):
            rules.force_label(f"/v1.41/containers/json?filters={filters}", "abc")


def test_the_kernels_operations_are_routed() -> None:
    assert rules.route("GET", "/v1.41/containers/json?all=1") == ("list", None)
    assert rules.route("POST", "/v1.43/containers/abc123/kill") == ("own", "abc123")
    assert rules.route("POST", "/v1.41/containers/abc123/start") == ("own", "abc123")
    assert rules.route("DELETE", "/containers/abc123?force=True&v=True") == ("own", "abc123")
    assert rules.route("GET", "/v1.41/images/fluffy/kernel:abc/json") == ("open", None)
    assert rules.route("POST", "/v1.41/containers/create?name=fluffy-x") == ("create", None)
    assert rules.route("GET", "/v1.41/volumes?filters=%7B%7D") == ("list", None)
    assert rules.route("GET", "/containers/json?all=1&trunc_cmd=0&size=0") == ("list", None)


def test_lists_are_limited_to_the_project() -> None:
    path = rules.force_label('/v1.41/containers/json?all=1&filters={"label":["a=1"]}', "abc")
    query = parse_qs(path.split("?", 1)[1])
    assert json.loads(query["filters"][0]) == {"label": ["a=1", f"{rules.PROJECT_LABEL}=abc"]}
    assert query["all"] == ["1"]
    bare = parse_qs(rules.force_label("/v1.41/volumes", "abc").split("?", 1)[1])
    assert json.loads(bare["filters"][0]) == {"label": [f"{rules.PROJECT_LABEL}=abc"]}
    for filters in ("notjson", "[" * 100_000, '{"label": 1}'):  # deep: no RecursionError
        with pytest.raises(rules.Refused, match="not JSON of the engine's form"):
            rules.force_label(f"/containers/json?filters={filters}", "abc")


def test_on_rootless_podman_the_gate_itself_maps_the_users_uid(scope: rules.Scope) -> None:
    """keep-id comes from the gate (wire.userns), never from L1: L1's own is refused."""
    scope.userns = {"UsernsMode": "keep-id"}
    assert rules.check_create(body(scope), scope)["HostConfig"]["UsernsMode"] == "keep-id"
    with pytest.raises(rules.Refused, match="UsernsMode"):
        rules.check_create(body(scope, UsernsMode="host"), scope)


Answer = Callable[[str, str, bytes], tuple[int, Any]]


@contextlib.contextmanager
def fake_engine(sock: Path, answer: Answer) -> Iterator[list[tuple[str, str, bytes]]]:
    """An HTTP server on ``sock`` answering ``answer(method, path, body)``; yields the
    requests it got."""
    got: list[tuple[str, str, bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            got.append((self.command, self.path, body))
            status, reply = answer(self.command, self.path, body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_DELETE = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

        def get_request(self) -> tuple[Any, Any]:
            request, _ = super().get_request()
            return request, ("local", 0)  # BaseHTTPRequestHandler wants an address pair

    server = Server(str(sock), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield got
    finally:
        server.shutdown()
        server.server_close()


#: A fake engine in its own process, so that it can run as another user than the tests
#: (the gate reads the uid serving the engine's socket): argv socket, status, answer.
USER_ENGINE = """
import http.server, json, socketserver, sys
path, status, answer = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        info = self.path == "/v4.0.0/libpod/info"
        self.send_response(status if info else 404)
        self.send_header("Content-Length", str(len(answer) if info else 2))
        self.end_headers()
        self.wfile.write(answer if info else b"{}")
    def log_message(self, *args):
        pass
class Server(socketserver.UnixStreamServer):
    def get_request(self):
        return self.socket.accept()[0], ("local", 0)
Server(path, Handler).serve_forever()
"""


@contextlib.contextmanager
def user_engine(status: int, answer: dict[str, Any], folder: Path | None = None) -> Iterator[str]:
    """A fake engine served by a user other than root (this test's own uid if it is not
    root, else nobody's), its socket in ``folder`` (default: a new one); yields its path."""
    folder = folder or Path(tempfile.mkdtemp(prefix="fluffy-user-engine-"))
    folder.chmod(0o777)  # nobody makes its socket here
    path = str(folder / "engine.sock")
    user = 65534 if os.getuid() == 0 else None
    # (the system's Python: nobody may not run one under root's home)
    python = "/usr/bin/python3" if user is not None else sys.executable
    args = [python, "-c", USER_ENGINE, path, str(status), json.dumps(answer)]
    proc = subprocess.Popen(args, user=user)
    try:
        deadline = time.monotonic() + 30
        while True:  # until it listens
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(path)
                    break
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, "no engine"
                    time.sleep(0.01)
        yield path
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder)


@pytest.mark.parametrize(
    ("status", "answer", "want"),
    [
        (200, {"host": {"security": {"rootless": True}}}, {"UsernsMode": "keep-id"}),
        (200, {"host": {"security": {"rootless": False}}}, {}),
        (404, {"message": "page not found"}, {}),  # Docker has no libpod info
        (200, {"host": {}}, {}),
    ],
)
def test_the_gate_asks_an_engine_a_user_serves_whether_it_is_rootless(
    status: int, answer: dict[str, Any], want: dict[str, str]
) -> None:
    from fluffy.gate import wire

    with user_engine(status, answer) as path:
        assert wire.userns(path) == want


def test_an_engine_that_did_not_answer_is_asked_again_and_answers_are_copies() -> None:
    from fluffy.gate import wire

    folder = Path(tempfile.mkdtemp(prefix="fluffy-user-engine-"))
    rootless = {"host": {"security": {"rootless": True}}}
    assert wire.userns(str(folder / "engine.sock")) == {}  # no engine there yet
    with user_engine(200, rootless, folder) as path:
        assert wire.userns(path) == {"UsernsMode": "keep-id"}  # the error was not kept
        wire.userns(path).clear()  # a caller's copy
        assert wire.userns(path) == {"UsernsMode": "keep-id"}


def test_without_peer_credentials_the_engine_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (macOS has no SO_PEERCRED): whoever serves the engine, its libpod info decides
    from fluffy.gate import wire

    monkeypatch.delattr(socket, "SO_PEERCRED", raising=False)

    def info(method: str, path: str, body: bytes) -> tuple[int, Any]:
        return 200, {"host": {"security": {"rootless": True}}}

    with fake_engine(tmp_path / "engine.sock", info) as got:
        assert wire.userns(str(tmp_path / "engine.sock")) == {"UsernsMode": "keep-id"}
    assert ("GET", "/v4.0.0/libpod/info", b"") in got


def test_an_engine_root_serves_is_rootful_without_its_info(tmp_path: Path) -> None:
    # root's Podman is never rootless: its libpod info (~170 ms) is not asked
    from fluffy.gate import wire

    if os.getuid() != 0:
        pytest.skip("only root can serve as root; CI runs as root")

    def info(method: str, path: str, body: bytes) -> tuple[int, Any]:
        return 200, {"host": {"security": {"rootless": True}}}  # (never asked)

    with fake_engine(tmp_path / "engine.sock", info) as got:
        assert wire.userns(str(tmp_path / "engine.sock")) == {}
        assert wire.userns(str(tmp_path / "engine.sock")) == {}  # asked once per process
    assert got == []
    assert wire.userns(str(tmp_path / "absent.sock")) == {}


def test_the_gate_refuses_and_logs_before_the_engine_hears_of_it(
    tmp_path: Path, scope: rules.Scope
) -> None:
    """Through the gate's socket: each attempt is a 403 and a line in the gate's log, and
    the engine gets none of them; the template reaches it serialised anew."""
    from fluffy.gate import server, wire

    mine = {"Id": "mine", "Config": {"Labels": {rules.PROJECT_LABEL: scope.project_id}}}

    def engine(method: str, path: str, body: bytes) -> tuple[int, Any]:
        return (201, {"Id": "new"}) if path.endswith("/create") else (200, mine)

    red = raw(scope, ', "hostconfig": null, "networkdisabled": false')
    attempts = [
        ("POST", "/v1.41/containers/create", red, "repeated"),
        ("POST", "/v1.41/containers/create", raw(scope, ', "Entrypoint": null'), "Entrypoint"),
        ("GET", "/v1.41/images/../containers/json", b"", "plain"),
        ("POST", "/v1.23/containers/mine/start", b'{"Privileged": true}', "older"),
        ("POST", "/v1.41/containers/mine/start", b'{"Privileged": true}', "only a create"),
        ("GET", '/v1.41/containers/json?Filters={"label":["x"]}', b"", "lower case"),
    ]
    log = tmp_path / "gate.log"
    with fake_engine(tmp_path / "engine.sock", engine) as got:
        gate = server.serve(tmp_path / "gate", str(tmp_path / "engine.sock"), scope, log)
        try:
            sock = str(tmp_path / "gate" / "engine.sock")
            for method, path, sent, said in attempts:
                _, status, answer = wire.request(sock, method, path, sent, timeout=10)
                assert status == 403 and said in json.loads(answer)["message"], (path, answer)
            for length in (b"abc", b"1_0", b"-1", b"99999999999"):  # no answer was no log line
                with socket.socket(socket.AF_UNIX) as client:
                    client.connect(sock)
                    client.sendall(b"POST /v1.41/containers/create HTTP/1.1\r\nContent-Length: ")
                    client.sendall(length + b"\r\n\r\n")
                    assert wire.parse(b"".join(iter(lambda: client.recv(65536), b"")))[0] == 403
            assert got == []
            _, status, _ = wire.request(sock, "POST", "/v1.41/containers/create", raw(scope))
        finally:
            gate.shutdown()
            for each in (gate, gate.dialler):
                assert each is not None
                each.server_close()
    assert status == 201 and len(got) == 1
    assert got[0][1] == "/v1.41/containers/create"
    assert got[0][2] == rules.create_body(raw(scope), scope)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["method"], e["path"]) for e in lines[:-4]] == [(m, p) for m, p, *_ in attempts]
    assert all(said in e["why"] for e, (*_, said) in zip(lines, attempts, strict=False))
    assert all("a request body of" in e["why"] for e in lines[-4:])
