from __future__ import annotations

import re

import pytest

from fluffy.errors import EngineUnavailable, FluffyError, ImageNotFound, all_error_classes


def test_every_error_has_a_unique_dotted_code() -> None:
    codes = [cls.code for cls in all_error_classes()]
    assert len(codes) == len(set(codes)), codes
    for code in codes:
        assert re.fullmatch(r"[a-z]+\.[a-z_]+", code), code


def test_every_error_class_is_drawn_in_the_module_docstring() -> None:
    import fluffy.errors

    doc = fluffy.errors.__doc__ or ""
    for cls in all_error_classes():
        assert re.search(rf"\b{cls.__name__}\s+{re.escape(cls.code)}\b", doc), cls.__name__


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
