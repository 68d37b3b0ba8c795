from __future__ import annotations

import pytest

from fluffy.errors import SandboxRunFailed
from fluffy.kernel.containers.engine import Engine
from fluffy.kernel.containers.oneshot import LABEL_PURPOSE, OneShot, run_oneshot


def _leftovers(engine: Engine, purpose: str) -> list[object]:
    return engine.client.api.containers(all=True, filters={"label": f"{LABEL_PURPOSE}={purpose}"})  # type: ignore[no-any-return]


def test_output_and_exit_code_are_returned_and_the_container_removed(
    engine: Engine, images: dict[str, str]
) -> None:
    result = run_oneshot(
        engine,
        OneShot(
            image=images["policy-sandbox"],
            command=[
                "python3",
                "-c",
                "import sys; print('out'); print('err', file=sys.stderr); sys.exit(4)",
            ],
            purpose="test-exit",
        ),
    )
    assert (result.exit_code, result.stdout.strip(), result.stderr.strip()) == (4, "out", "err")
    assert _leftovers(engine, "test-exit") == []


def test_time_limit_kills_and_removes(engine: Engine, images: dict[str, str]) -> None:
    with pytest.raises(SandboxRunFailed) as info:
        run_oneshot(
            engine,
            OneShot(
                image=images["policy-sandbox"],
                command=["python3", "-c", "import time; time.sleep(60)"],
                purpose="test-timeout",
                timeout_s=2,
            ),
        )
    assert "did not finish within 2 s" in info.value.what
    assert _leftovers(engine, "test-timeout") == []


def test_pid_limit_holds(engine: Engine, images: dict[str, str]) -> None:
    forker = (
        "import errno, os\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        if os.fork() == 0:\n"
        "            import time; time.sleep(5); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print(errno.errorcode[exc.errno], n)\n"
    )
    result = run_oneshot(
        engine,
        OneShot(
            image=images["code-executor"],
            command=["python3", "-c", forker],
            purpose="test-pids",
            pids_limit=20,
        ),
    )
    code, forked = result.stdout.split()
    assert code == "EAGAIN" and int(forked) < 20
