"""The one place where container-engine exceptions become fluffy errors.

Everything that calls the docker SDK (which also speaks to Podman's compatible API)
wraps the call in :func:`engine_call`; no other module catches ``docker.errors.*``
or ``requests.exceptions.*``.  ``tests/unit/kernel/containers/test_engine_errors.py``
checks that every foreign exception class :func:`mapped` lists is mapped to a fluffy
error.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    import docker.errors


@functools.cache
def mapped() -> tuple[type[BaseException], ...]:
    """The foreign exception classes this module maps, most specific first (the SDKs
    load here, when an engine call first fails, not with the kernel)."""
    import docker.errors
    import podman.errors
    import requests.exceptions

    return (
        podman.errors.ImageNotFound,
        podman.errors.NotFound,
        podman.errors.BuildError,
        podman.errors.APIError,
        podman.errors.PodmanError,
        docker.errors.ImageNotFound,
        docker.errors.BuildError,
        docker.errors.ContainerError,
        docker.errors.NotFound,
        docker.errors.APIError,
        docker.errors.DockerException,
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        requests.exceptions.RequestException,
        PermissionError,
        FileNotFoundError,
        ConnectionError,
        OSError,
    )


def _explain(exc: docker.errors.APIError) -> str:
    explanation = getattr(exc, "explanation", None)
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return str(explanation or exc).strip()


def _is_read_timeout(exc: BaseException) -> bool:
    """requests reports a timed-out *streamed* read as ConnectionError(ReadTimeoutError)."""
    import requests.exceptions
    import urllib3.exceptions

    return isinstance(exc, requests.exceptions.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args
    )


def _map_podman(exc: BaseException, action: str) -> FluffyError:
    import podman.errors
    import requests.exceptions

    detail = str(getattr(exc, "explanation", None) or exc).strip()
    if isinstance(exc, podman.errors.ImageNotFound):
        return ImageNotFound(f"cannot {action}: image not found ({detail})")
    if isinstance(exc, podman.errors.NotFound):
        return EngineNotFound(f"cannot {action}: not found ({detail})")
    if isinstance(exc, podman.errors.BuildError):
        return ImageBuildFailed(f"cannot {action}: {detail}")
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, requests.exceptions.Timeout):  # podman wraps its timeouts
        return map_engine_error(cause, action)
    return EngineOperationFailed(
        f"cannot {action}: podman answered: {detail}",
        why="the container engine refused the request",
        fix="Check `podman info` and the podman service's log, then retry.",
    )


def map_engine_error(exc: BaseException, action: str) -> FluffyError:
    """Translate ``exc`` raised while doing ``action`` ("build image fluffy/kernel")."""
    if isinstance(exc, FluffyError):
        return exc
    import docker.errors
    import podman.errors
    import requests.exceptions

    if isinstance(exc, podman.errors.APIError | podman.errors.PodmanError):
        return _map_podman(exc, action)
    if isinstance(exc, docker.errors.ImageNotFound):
        return ImageNotFound(f"cannot {action}: image not found ({_explain(exc)})")
    if isinstance(exc, docker.errors.BuildError):
        tail = "".join(
            str(chunk.get("stream", ""))
            for chunk in list(exc.build_log)[-15:]
            if isinstance(chunk, dict)
        ).strip()
        return ImageBuildFailed(
            f"cannot {action}: {exc.msg}",
            why=f"the engine's build stopped; last output:\n{tail}" if tail else exc.msg,
            fix="Read the build output above; re-run with `fluffy images build --verbose`.",
        )
    if isinstance(exc, docker.errors.ContainerError):
        stderr = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else ""
        return SandboxRunFailed(
            f"cannot {action}: command exited with status {exc.exit_status}",
            why=stderr.strip()[-2000:] or "the command failed inside the container",
            fix="Run the same command again with --verbose to see its full output.",
        )
    if isinstance(exc, docker.errors.NotFound):
        return EngineNotFound(f"cannot {action}: not found ({_explain(exc)})")
    if isinstance(exc, docker.errors.APIError):
        status = exc.status_code
        return EngineOperationFailed(
            f"cannot {action}: the engine answered {status}: {_explain(exc)}",
            why="the container engine refused the request",
            fix="Check `docker info` (or `podman info`) and the engine's log, then retry.",
        )
    if isinstance(exc, requests.exceptions.Timeout) or _is_read_timeout(exc):
        return EngineTimeout(
            f"cannot {action}: the engine did not answer in time",
            why="the call took longer than fluffy allows",
            fix="Check the engine's load (`docker stats`), then retry.",
        )
    if isinstance(exc, PermissionError) or (
        isinstance(exc, requests.exceptions.ConnectionError) and "Permission denied" in str(exc)
    ):
        return EngineUnavailable(
            f"cannot {action}: permission denied on the engine socket",
            why="this user may not use the container engine's socket",
            fix="Add yourself to the `docker` group (`sudo usermod -aG docker $USER`, then log "
            "in again), or use rootless Podman.",
        )
    if isinstance(
        exc,
        docker.errors.DockerException
        | requests.exceptions.RequestException
        | ConnectionError
        | FileNotFoundError,
    ):
        return EngineUnavailable(f"cannot {action}: the container engine does not answer ({exc})")
    if isinstance(exc, OSError):
        code = errno.errorcode.get(exc.errno or 0, "?")
        return EngineError(f"cannot {action}: {code}: {exc.strerror or exc}")
    raise TypeError(f"unmapped engine exception {type(exc).__name__}") from exc


@contextmanager
def engine_call(action: str) -> Iterator[None]:
    """Run an engine call; re-raise anything it throws as a fluffy error."""
    try:
        yield
    except FluffyError:
        raise
    except Exception as exc:
        if not isinstance(exc, mapped()):
            raise
        raise map_engine_error(exc, action) from exc
