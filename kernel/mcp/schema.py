"""A tool's JSON schema, as the kernel may use it: checked when listed, arguments checked
against it in linear time.

An MCP server writes its tools' schemas, so a schema is hostile input: a ``pattern`` of
nested quantifiers (``^(a+)+$``) would make Python's ``re`` backtrack for hours on a
short argument, in the kernel's event loop.  Here ``pattern`` runs in RE2 (linear in
the text, memory capped, as ``search.grep``); a schema with ``patternProperties``
(matched by jsonschema with ``re`` inside ``additionalProperties`` too) or one that
recurses without end is not used for the kernel's check (the server still checks its
own arguments); arguments over 256 KiB are refused before any check.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, Final

import re2

if TYPE_CHECKING:  # jsonschema loads with the first MCP server, not with the kernel
    from jsonschema import ValidationError

MAX_ARGUMENT_BYTES: Final = 256 * 1024
REGEX_MEMORY: Final = 8 * 1024 * 1024


@lru_cache(maxsize=256)
def _regex(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = REGEX_MEMORY
    try:
        return re2.compile(pattern, options)
    except re2.error:
        return None


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "string"):
        return
    regex = _regex(pattern)
    if regex is None:
        yield ValidationError(f"the schema's pattern {pattern!r} is not an RE2 expression")
    elif not regex.search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@cache
def _linear() -> Any:
    """Draft 2020-12 with ``pattern`` in RE2."""
    from jsonschema import Draft202012Validator
    from jsonschema.validators import extend

    return extend(Draft202012Validator, validators={"pattern": _pattern})  # type: ignore[no-untyped-call]


def _mentions(schema: Any, key: str) -> bool:
    if isinstance(schema, dict):
        return key in schema or any(_mentions(v, key) for v in schema.values())
    if isinstance(schema, list):
        return any(_mentions(v, key) for v in schema)
    return False


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why ``schema`` is not a JSON schema (None: it is one)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(dict(schema))
    except SchemaError as exc:
        return f"not a JSON schema: {exc.message[:200]}"
    except RecursionError:
        return "not a JSON schema: nested too deeply"
    return None


def validator_for(schema: Mapping[str, Any]) -> Any | None:
    """The kernel's linear-time validator for ``schema``; None where it checks nothing."""
    if schema_problem(schema) is not None or _mentions(schema, "patternProperties"):
        return None
    return _linear()(dict(schema))


def argument_errors(validator: Any, args: Mapping[str, Any]) -> list[ValidationError]:
    """What is wrong with ``args`` (empty: nothing); a schema that recurses without end
    checks nothing."""
    from jsonschema import ValidationError

    if len(json.dumps(args)) > MAX_ARGUMENT_BYTES:
        return [ValidationError(f"the arguments are over {MAX_ARGUMENT_BYTES // 1024} KiB")]
    try:
        return sorted(validator.iter_errors(dict(args)), key=lambda e: list(e.path))
    except RecursionError:
        return []
