"""A container lookup Podman answers with "no such process" while the container's
process exits (Podman 4.3, seen in CI: ``fluffy sandbox run`` failed after its command
had run) is asked again; any other refusal is not."""

from __future__ import annotations

from typing import Any

import pytest
from podman.errors import APIError

from fluffy.errors import EngineNotFound, EngineOperationFailed
from fluffy.kernel.containers import podman_runtime
from fluffy.kernel.containers.podman_runtime import PodmanRuntime

pytestmark = pytest.mark.unit


class Containers:
    def __init__(self, answers: list[Exception | str]) -> None:
        self.answers = answers
        self.asked = 0

    def get(self, container_id: str) -> Any:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def runtime(answers: list[Exception | str]) -> tuple[PodmanRuntime, Containers]:
    made = PodmanRuntime.__new__(PodmanRuntime)  # no service: the client is a stand-in
    containers = Containers(answers)
    made._client = type("Client", (), {"containers": containers})()
    return made, containers


def exiting() -> APIError:
    return APIError("500 Server Error", explanation="read /proc/15973/cgroup: no such process")


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(podman_runtime.time, "sleep", slept.append)
    return slept


def test_a_lookup_while_the_process_exits_is_asked_again(no_waiting: list[float]) -> None:
    made, containers = runtime([exiting(), exiting(), "the container"])
    assert made._get("4a78718a0ac3") == "the container"
    assert containers.asked == 3 and no_waiting == [0.05, 0.1]


def test_it_is_asked_a_few_times_then_the_refusal_stands(no_waiting: list[float]) -> None:
    made, containers = runtime([exiting() for _ in range(5)])
    with pytest.raises(EngineOperationFailed, match="no such process"):
        made._get("4a78718a0ac3")
    assert containers.asked == 5 and len(no_waiting) == 4


@pytest.mark.parametrize(
    "refusal",
    [APIError("500", explanation="permission denied"), "missing"],
)
def test_other_refusals_are_not_asked_again(refusal: Any, no_waiting: list[float]) -> None:
    from podman.errors import NotFound

    error = NotFound("no such container") if refusal == "missing" else refusal
    made, containers = runtime([error, "the container"])
    with pytest.raises(EngineNotFound if refusal == "missing" else EngineOperationFailed):
        made._get("4a78718a0ac3")
    assert containers.asked == 1 and no_waiting == []
