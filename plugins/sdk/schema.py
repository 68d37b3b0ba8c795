"""The JSON-schema subset tool inputs are declared in, and its validator.

Supported keywords: ``type`` (one of object, string, integer, number, boolean, array),
``properties``, ``required``, ``additionalProperties`` (true/false), ``enum``,
``minLength``/``maxLength``, ``minimum``/``maximum``, ``items``, ``minItems``/
``maxItems``, and the annotations ``description``, ``title`` and ``default``.  Anything
else is refused when the tool is *defined* (:func:`check_schema`), so that a schema never
silently promises a check the validator does not make.

:func:`validate` checks one value and returns it with the ``default`` of every missing
optional property filled in.  Standard library only (runs in L2 sandboxes).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from fluffy.errors import ConfigError, ToolInputInvalid

TYPES = ("object", "string", "integer", "number", "boolean", "array")
ANNOTATIONS = frozenset({"description", "title", "default"})
#: keyword -> the types it applies to (None: every type)
KEYWORDS: dict[str, tuple[str, ...] | None] = {
    "type": None,
    "enum": None,
    "properties": ("object",),
    "required": ("object",),
    "additionalProperties": ("object",),
    "minLength": ("string",),
    "maxLength": ("string",),
    "minimum": ("integer", "number"),
    "maximum": ("integer", "number"),
    "items": ("array",),
    "minItems": ("array",),
    "maxItems": ("array",),
}


def _refuse(where: str, problem: str) -> ConfigError:
    return ConfigError(
        f"tool input schema {where}: {problem}",
        why="tool schemas use a small JSON-schema subset that the plugin host checks itself",
        fix="Use only: type, properties, required, additionalProperties (bool), enum, "
        "minLength, maxLength, minimum, maximum, items, minItems, maxItems, description, "
        "title, default.",
    )


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_schema(schema: Any, where: str = "$") -> None:
    """Raise :class:`ConfigError` unless ``schema`` is a well-formed schema of the subset."""
    if not isinstance(schema, Mapping):
        raise _refuse(where, f"a schema must be an object, not {type(schema).__name__}")
    unknown = sorted(str(k) for k in schema if k not in KEYWORDS and k not in ANNOTATIONS)
    if unknown:
        raise _refuse(where, f"unsupported keyword(s) {', '.join(unknown)}")
    kind = schema.get("type")
    if kind is None and "enum" not in schema:
        raise _refuse(where, "every schema needs a 'type' (or an 'enum')")
    if kind is not None and kind not in TYPES:
        raise _refuse(where, f"type {kind!r} is not one of {', '.join(TYPES)}")
    for keyword in schema:
        applies = KEYWORDS.get(keyword)
        if applies is not None and kind not in applies:
            raise _refuse(where, f"{keyword} applies to {'/'.join(applies)} schemas only")
    for keyword in ("minLength", "maxLength", "minItems", "maxItems"):
        if keyword in schema and not _count(schema[keyword]):
            raise _refuse(where, f"{keyword} must be a non-negative integer")
    for keyword in ("minimum", "maximum"):
        if keyword in schema and not _number(schema[keyword]):
            raise _refuse(where, f"{keyword} must be a number")
    if "additionalProperties" in schema and not isinstance(schema["additionalProperties"], bool):
        raise _refuse(where, "additionalProperties must be true or false")
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise _refuse(where, "properties must be an object of schemas")
    for name, sub in properties.items():
        check_schema(sub, f"{where}.{name}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _refuse(where, "required must be a list of property names")
    if len(set(required)) != len(required):
        raise _refuse(where, "required lists a property twice")
    missing = [r for r in required if r not in properties]
    if missing:
        raise _refuse(where, f"required names undeclared properties: {', '.join(missing)}")
    if "items" in schema:
        check_schema(schema["items"], f"{where}[]")
    if "enum" in schema:
        enum = schema["enum"]
        if not isinstance(enum, list) or not enum:
            raise _refuse(where, "enum must be a non-empty list")
        if not all(v is None or isinstance(v, str | int | float | bool) for v in enum):
            raise _refuse(where, "enum values must be strings, numbers, booleans or null")
    if "default" in schema:
        try:
            validate(schema, schema["default"], where)
        except ToolInputInvalid as exc:
            raise _refuse(where, f"the default does not match the schema ({exc.what})") from None


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _is(kind: str, value: Any) -> bool:
    actual = _type_name(value)
    return actual == kind or (kind == "number" and actual == "integer")


def _invalid(where: str, problem: str) -> ToolInputInvalid:
    return ToolInputInvalid(f"{where}: {problem}")


def validate(schema: Mapping[str, Any], value: Any, where: str = "args") -> Any:
    """``value`` checked against ``schema`` (defaults filled in), or :class:`ToolInputInvalid`."""
    kind = schema.get("type")
    if kind is not None and not _is(kind, value):
        raise _invalid(where, f"expected {kind}, got {_type_name(value)}")
    if "enum" in schema and not any(
        _type_name(value) == _type_name(option) and value == option for option in schema["enum"]
    ):
        choices = ", ".join(repr(option) for option in schema["enum"])
        raise _invalid(where, f"must be one of {choices}, got {value!r}")
    if kind == "string":
        if "minLength" in schema and len(value) < schema["minLength"]:
            raise _invalid(where, f"must be at least {schema['minLength']} characters long")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise _invalid(where, f"must be at most {schema['maxLength']} characters long")
    elif kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            raise _invalid(where, f"must be at least {schema['minimum']}, got {value}")
        if "maximum" in schema and value > schema["maximum"]:
            raise _invalid(where, f"must be at most {schema['maximum']}, got {value}")
    elif kind == "array":
        if "minItems" in schema and len(value) < schema["minItems"]:
            raise _invalid(where, f"needs at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            raise _invalid(where, f"takes at most {schema['maxItems']} items")
        items = schema.get("items")
        if items is not None:
            return [validate(items, item, f"{where}[{i}]") for i, item in enumerate(value)]
        return list(value)
    elif kind == "object":
        return _validate_object(schema, value, where)
    return value


def _validate_object(schema: Mapping[str, Any], value: Mapping[Any, Any], where: str) -> Any:
    properties: Mapping[str, Any] = schema.get("properties", {})
    for key in value:
        if not isinstance(key, str):
            raise _invalid(where, f"property names must be strings, got {key!r}")
    missing = [name for name in schema.get("required", []) if name not in value]
    if missing:
        raise _invalid(where, f"missing required argument(s): {', '.join(missing)}")
    if schema.get("additionalProperties", True) is False:
        extra = sorted(key for key in value if key not in properties)
        if extra:
            allowed = ", ".join(properties) or "none"
            raise _invalid(where, f"unknown argument(s) {', '.join(extra)} (allowed: {allowed})")
    checked: dict[str, Any] = {}
    for key, item in value.items():
        sub = properties.get(key)
        checked[key] = validate(sub, item, f"{where}.{key}") if sub is not None else item
    for name, sub in properties.items():
        if name not in checked and "default" in sub:
            checked[name] = copy.deepcopy(sub["default"])
    return checked
