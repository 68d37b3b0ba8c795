"""container.run's plugin side, against temp folders standing in for its mounts: the
command runs without a shell in the view with the tests' environment, its output comes
back bounded and with control characters visible, and nothing it started outlives it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from fluffy.plugins.container_tool.plugin import HEAD_BYTES, TAIL_BYTES
from fluffy.plugins.sdk import Roots
from tests.unit.plugins.test_builtin_plugins import call, error, ok
from tests.unit.plugins.test_builtin_plugins import roots as roots  # the fixture
from tests.unit.trees import write_tree

pytestmark = pytest.mark.unit
PY = sys.executable


def run(roots: Roots, argv: list[str], **more: object) -> dict[str, object]:
    return ok(call(roots, "container.run", {"argv": argv, **more}))


def test_a_command_runs_in_the_view_with_its_exit_code_and_output(roots: Roots) -> None:
    write_tree(
        roots.workspace, {"pkg/__init__.py": "", "pkg/__main__.py": "print('hello from pkg')\n"}
    )
    done = run(roots, [PY, "-c", "import sys, pkg.__main__; sys.exit(3)"])
    assert done["exit_code"] == 3 and done["timed_out"] is False
    assert done["output"] == "hello from pkg\n" and done["truncated"] is False
    assert done["argv"][0] == PY
    # no shell: a metacharacter is an argument like any other
    echoed = run(roots, ["echo", "a;", "rm", "-rf", "$HOME", "|", "x"])
    assert echoed["output"] == "a; rm -rf $HOME | x\n"
    assert set(os.listdir(roots.workspace)) == {"pkg"}


def test_stdout_and_stderr_come_interleaved_and_in_a_folder_given(roots: Roots) -> None:
    write_tree(roots.workspace, {"sub/marker.txt": "x"})
    code = "import os, sys; print('out', flush=True); print(os.listdir('.'), file=sys.stderr)"
    done = run(roots, [PY, "-c", code], cwd="sub")
    assert done["output"] == "out\n['marker.txt']\n"
    message = error(
        call(roots, "container.run", {"argv": ["true"], "cwd": "nope"}), "tool.input_invalid"
    )
    assert "not a folder of the project" in message


def test_a_missing_program_answers_like_a_shell(roots: Roots) -> None:
    done = run(roots, ["no-such-program-fluffy"])
    assert done["exit_code"] == 127
    assert "no-such-program-fluffy: no such program" in str(done["output"])


def test_control_characters_are_made_visible(roots: Roots) -> None:
    code = r"print('\x1b[2Jred\x1b]0;title\x07 bidi\u202e done\r')"
    done = run(roots, [PY, "-c", code])
    assert "\x1b" not in str(done["output"]) and "\u202e" not in str(done["output"])
    assert done["output"] == "\\x1b[2Jred\\x1b]0;title\\x07 bidi<U+202E> done\\r\n"


def test_long_output_keeps_its_start_and_its_end(roots: Roots) -> None:
    total = 5 * (HEAD_BYTES + TAIL_BYTES)
    code = f"import sys; sys.stdout.write('S' + 'x' * {total - 2} + 'E')"
    done = run(roots, [PY, "-c", code])
    text = str(done["output"])
    assert done["output_bytes"] == total and done["truncated"] is True
    assert text.startswith("S") and text.endswith("E")
    left_out = total - HEAD_BYTES - TAIL_BYTES
    assert f"[... {left_out} bytes of output not kept ...]" in text
    assert len(text) < HEAD_BYTES + TAIL_BYTES + 100


def test_a_time_out_kills_the_command_and_what_it_started(roots: Roots, tmp_path: Path) -> None:
    marker = tmp_path / "child-alive"
    child = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).write_text('x')"
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    started = time.monotonic()
    done = run(roots, [PY, "-c", code], timeout_s=1)
    assert time.monotonic() - started < 30
    assert done["timed_out"] is True and done["exit_code"] == -9 and done["signal"] == "SIGKILL"
    assert done["output"] == "started\n" and "time-out" in str(done["note"])
    time.sleep(4)  # the grandchild would have written its marker by now
    assert not marker.exists()


def test_background_work_dies_with_a_command_that_returned(roots: Roots, tmp_path: Path) -> None:
    marker = tmp_path / "left-behind"
    child = f"import time, pathlib; time.sleep(2); pathlib.Path({str(marker)!r}).write_text('x')"
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}])"
    assert run(roots, [PY, "-c", code])["exit_code"] == 0
    time.sleep(3)
    assert not marker.exists()


def test_the_project_environment_comes_first_on_path(roots: Roots, tmp_path: Path) -> None:
    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python").symlink_to(PY)
    code = "import os; print(os.environ['VIRTUAL_ENV'], os.environ['TERM'])"
    args = {"argv": ["python", "-c", code]}
    done = ok(call(roots, "container.run", args, settings={"python": str(env_bin / "python")}))
    assert done["output"] == f"{env_bin.parent} xterm-256color\n"


@pytest.mark.parametrize(
    "args",
    [{"argv": "python -m pkg"}, {"argv": []}, {"argv": ["x"], "timeout_s": 601}, {"argv": [1]},
     {"argv": ["x"], "shell": True}],
)  # fmt: skip
def test_arguments_outside_the_schema_are_refused(roots: Roots, args: dict[str, object]) -> None:
    error(call(roots, "container.run", args), "tool.input_invalid")
