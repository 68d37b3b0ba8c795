from __future__ import annotations

import re

import pytest

from fluffy.errors import (
    AiError,
    EngineUnavailable,
    FluffyError,
    ImageNotFound,
    Quarantined,
    ToolUnavailable,
    TurnRunning,
    WorkflowError,
    all_error_classes,
)

#: Areas whose classes sit under another area's branch, on purpose: a project's test
#: environment (env.*) is an image fluffy builds, so its errors are image errors.
BORROWED_AREAS = {"env": "image"}


def test_every_error_has_a_unique_dotted_code() -> None:
    codes = [cls.code for cls in all_error_classes()]
    assert len(codes) == len(set(codes)), codes
    for code in codes:
        assert re.fullmatch(r"[a-z]+\.[a-z_]+", code), code


def test_defaults_and_overrides_of_why_and_fix() -> None:
    error = EngineUnavailable("no engine")
    assert error.why and error.fix  # class defaults
    custom = EngineUnavailable("no engine", why="because", fix="do this")
    assert (custom.why, custom.fix) == ("because", "do this")


def test_with_context_prefixes_the_message_and_keeps_the_code() -> None:
    error = ImageNotFound("image x is missing").with_context("cannot start sandbox s1")
    assert str(error) == "cannot start sandbox s1: image x is missing"
    assert error.to_dict()["code"] == "engine.image_not_found"
    assert error.to_dict()["what"] == str(error)


def test_errors_are_exceptions_of_the_one_tree() -> None:
    with pytest.raises(FluffyError):
        raise ImageNotFound("x")


def _branch(cls: type[FluffyError]) -> type[FluffyError]:
    """The child of FluffyError that ``cls`` descends from (its branch of the tree)."""
    return next(
        c for c in reversed(cls.__mro__) if c is not FluffyError and issubclass(c, FluffyError)
    )


def test_every_class_sits_in_the_branch_its_code_names() -> None:
    misplaced = []
    for cls in all_error_classes()[1:]:
        area, branch_area = cls.code.split(".")[0], _branch(cls).code.split(".")[0]
        if BORROWED_AREAS.get(area, area) != branch_area:
            misplaced.append(f"{cls.__name__} ({cls.code}) under {_branch(cls).__name__}")
    assert misplaced == []


def test_a_running_turn_and_a_quarantine_are_ai_errors_not_workflow_errors() -> None:
    for cls in (TurnRunning, Quarantined):
        assert issubclass(cls, AiError) and not issubclass(cls, WorkflowError), cls
    assert (TurnRunning.code, Quarantined.code) == ("ai.turn_running", "ai.quarantined")


def test_tool_unavailable_has_one_code_and_its_design_tag_is_spelled_from_it() -> None:
    error = ToolUnavailable(
        "fs.write is not available in test_writing",
        tool_name="fs.write",
        current_state="test_writing",
        reason="only tests may be written now",
        available_tools=["fs.read"],
    )
    data = error.to_dict()
    assert data["code"] == "tool.unavailable"
    assert data["error"] == "tool_unavailable"  # the wire shows the design's tag as before
    assert data["why"] == "only tests may be written now" and data["available_tools"] == ["fs.read"]
    extra = [k for k in vars(ToolUnavailable) if k.endswith(("code", "_tag")) and k != "code"]
    assert extra == []
