"""Property: in strict mode no sequence of events reaches code_writing without red evidence.

The oracle is independent of the guards: it knows, by construction, which recorded runs
were red (a test file written in this test_writing stint failing on an assertion) and
whether any file changed after the run.
"""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fluffy.errors import FluffyError
from fluffy.kernel.workflow.states import EVENTS
from unit.workflow_support import fake_run, make_project, open_kit

ACTIONS = [f"fire:{e}" for e in EVENTS] + [
    "red_run",  # a new test file failing on an assertion, recorded
    "import_error_run",  # a new test file that cannot be imported, recorded
    "old_test_fails_run",  # tests/test_calc.py failing on an assertion, recorded
    "passing_run",
    "touch_source",
    "touch_test",
]


START = ["fire:user_message", "fire:plan_complete"]  # most examples start a flow
REACHED: list[bool] = []


@settings(max_examples=60, deadline=None)
@given(
    st.tuples(st.booleans(), st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=30)).map(
        lambda pair: (START if pair[0] else []) + pair[1]
    )
)
def test_strict_mode_never_reaches_code_writing_without_a_red_run(actions: list[str]) -> None:
    counter = itertools.count()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project = make_project(root / "p")

        async def main() -> None:
            kit = await open_kit(root / "s", project)
            wf = kit.workflow
            sid = (await wf.new_session()).id
            red_evidence = False  # oracle: a red run in this stint, nothing changed since
            touched_tests = False  # tests/test_calc.py changed in this test_writing stint
            try:
                for action in actions:
                    state = (await wf.get(sid)).state
                    if action.startswith("fire:"):
                        try:
                            outcome = await wf.fire(sid, action[5:])
                        except FluffyError:
                            continue
                        if outcome.session.state == "code_writing" and state == "test_writing":
                            assert red_evidence, f"reached code_writing without red: {actions}"
                            REACHED.append(True)
                        if outcome.session.state == "test_writing":
                            red_evidence = touched_tests = False
                        continue
                    n = next(counter)
                    if action in ("red_run", "import_error_run"):
                        name = f"tests/test_new{n}.py"
                        (project / name).write_text(f"def test_{n}():\n    assert False\n")
                        outcome_kind = "failed" if action == "red_run" else "error"
                        recorded = fake_run(
                            project, [(f"{name}::test_{n}", outcome_kind, action == "red_run")]
                        )
                        await wf.record_test_run(sid, recorded)
                        red_evidence = action == "red_run" and state == "test_writing"
                    elif action == "old_test_fails_run":
                        await wf.record_test_run(
                            sid,
                            fake_run(project, [("tests/test_calc.py::test_add", "failed", True)]),
                        )
                        # red only if this stint changed its file: then it is a changed test
                        red_evidence = touched_tests and state == "test_writing"
                    elif action == "passing_run":
                        await wf.record_test_run(
                            sid,
                            fake_run(project, [("tests/test_calc.py::test_add", "passed", False)]),
                        )
                        red_evidence = False
                    else:
                        target = "src/calc.py" if action == "touch_source" else "tests/test_calc.py"
                        with (project / target).open("a") as handle:
                            handle.write(f"# {n}\n")
                        red_evidence = False
                        touched_tests = touched_tests or (
                            action == "touch_test" and state == "test_writing"
                        )
            finally:
                await kit.close()

        asyncio.run(main())  # a hypothesis example per loop


def test_the_property_is_not_vacuous() -> None:
    """The generator does reach code_writing (runs after the property test in this file)."""
    actions = [*START, "red_run", "fire:tests_red"]
    REACHED.clear()
    test_strict_mode_never_reaches_code_writing_without_a_red_run.hypothesis.inner_test(actions)  # type: ignore[attr-defined]
    assert REACHED == [True]
