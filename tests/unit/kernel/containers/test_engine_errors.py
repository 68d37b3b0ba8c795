"""Every foreign engine exception is mapped to fluffy's tree, in one place."""

from __future__ import annotations

import errno
from typing import Any

import docker.errors
import podman.errors
import pytest
import requests
import requests.exceptions
import urllib3.exceptions

from fluffy.errors import (
    EngineError,
    EngineNotFound,
    EngineOperationFailed,
    EngineTimeout,
    EngineUnavailable,
    FluffyError,
    ImageBuildFailed,
    ImageNotFound,
    SandboxRunFailed,
)
from fluffy.kernel.containers.errors import engine_call, map_engine_error, mapped


def _http_error(status: int, text: str) -> requests.exceptions.HTTPError:
    response = requests.Response()
    response.status_code = status
    response._content = text.encode()
    return requests.exceptions.HTTPError(response=response)


def _instance(cls: type[BaseException]) -> BaseException:
    samples: dict[type[BaseException], Any] = {
        podman.errors.ImageNotFound: lambda: podman.errors.ImageNotFound("image not known"),
        podman.errors.NotFound: lambda: podman.errors.NotFound("no such container"),
        podman.errors.BuildError: lambda: podman.errors.BuildError("step failed", []),
        podman.errors.APIError: lambda: podman.errors.APIError("500: boom"),
        podman.errors.PodmanError: lambda: podman.errors.PodmanError("broken"),
        docker.errors.ImageNotFound: lambda: docker.errors.ImageNotFound("No such image: x"),
        docker.errors.BuildError: lambda: docker.errors.BuildError(
            "step failed", [{"stream": "Step 1/2 : RUN false\n"}]
        ),
        docker.errors.ContainerError: lambda: docker.errors.ContainerError(
            "c1", 3, ["false"], "img", b"boom"
        ),
        docker.errors.NotFound: lambda: docker.errors.NotFound("no such container"),
        docker.errors.APIError: lambda: docker.errors.APIError(
            "500 Server Error", response=_http_error(500, "").response, explanation="broken"
        ),
        docker.errors.DockerException: lambda: docker.errors.DockerException("no socket"),
        requests.exceptions.ConnectionError: lambda: requests.exceptions.ConnectionError("refused"),
        requests.exceptions.Timeout: lambda: requests.exceptions.ReadTimeout("slow"),
        requests.exceptions.RequestException: lambda: requests.exceptions.RequestException("x"),
        PermissionError: lambda: PermissionError(errno.EACCES, "Permission denied"),
        FileNotFoundError: lambda: FileNotFoundError(errno.ENOENT, "No such file"),
        ConnectionError: lambda: ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        OSError: lambda: OSError(errno.EIO, "I/O error"),
    }
    return samples[cls]()  # type: ignore[no-any-return]


@pytest.mark.parametrize("cls", mapped(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_mapped_class_becomes_a_fluffy_error(cls: type[BaseException]) -> None:
    mapped = map_engine_error(_instance(cls), "do a thing")
    assert isinstance(mapped, FluffyError)
    assert "cannot do a thing" in mapped.what
    assert mapped.fix or mapped.why


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (docker.errors.ImageNotFound("No such image: x"), ImageNotFound),
        (docker.errors.NotFound("no such container"), EngineNotFound),
        (docker.errors.BuildError("bad", []), ImageBuildFailed),
        (docker.errors.ContainerError("c", 1, "x", "i", b""), SandboxRunFailed),
        (requests.exceptions.ReadTimeout("slow"), EngineTimeout),
        (
            requests.exceptions.ConnectionError(
                urllib3.exceptions.ReadTimeoutError(None, None, "Read timed out.")  # type: ignore[arg-type]
            ),
            EngineTimeout,
        ),
        (requests.exceptions.ConnectionError("refused"), EngineUnavailable),
        (PermissionError(errno.EACCES, "denied"), EngineUnavailable),
        (OSError(errno.EIO, "io"), EngineError),
        (podman.errors.ImageNotFound("image not known"), ImageNotFound),
        (podman.errors.NotFound("no such container"), EngineNotFound),
        (podman.errors.APIError("500"), EngineOperationFailed),
    ],
)
def test_specific_mappings(exc: BaseException, expected: type[FluffyError]) -> None:
    assert type(map_engine_error(exc, "x")) is expected


def test_permission_denied_explains_the_docker_group() -> None:
    mapped = map_engine_error(
        requests.exceptions.ConnectionError(
            "('Connection aborted.', PermissionError(13, 'Permission denied'))"
        ),
        "connect",
    )
    assert isinstance(mapped, EngineUnavailable)
    assert "docker" in mapped.fix and "group" in mapped.fix


def test_podman_wrapped_timeouts_are_timeouts() -> None:
    try:
        try:
            raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=2)")
        except requests.exceptions.ReadTimeout as inner:
            raise podman.errors.APIError("POST operation failed") from inner
    except podman.errors.APIError as outer:
        assert type(map_engine_error(outer, "wait")) is EngineTimeout


def test_api_error_carries_the_engine_explanation() -> None:
    exc = docker.errors.APIError("409", explanation="conflict: name in use")
    mapped = map_engine_error(exc, "create c1")
    assert isinstance(mapped, EngineOperationFailed)
    assert "conflict: name in use" in mapped.what


def test_engine_call_chains_the_original_exception() -> None:
    with pytest.raises(EngineUnavailable) as info, engine_call("ping"):
        raise requests.exceptions.ConnectionError("refused")
    assert isinstance(info.value.__cause__, requests.exceptions.ConnectionError)


def test_engine_call_leaves_unrelated_exceptions_alone() -> None:
    with pytest.raises(KeyError), engine_call("ping"):
        raise KeyError("not an engine error")
