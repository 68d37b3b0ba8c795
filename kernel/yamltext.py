"""YAML the kernel reads from users and plugins: ``safe_load`` without aliases.

Aliases are the vehicle of "billion laughs" bombs; policy files and plugin manifests have
no use for them.  A syntax error comes back as :class:`YamlSyntax` naming the source and
line, for the caller to raise as its own error.
"""

from __future__ import annotations

from typing import Any

import yaml


class YamlSyntax(Exception):
    """``{source}:{line}: not valid YAML: {problem}``."""


class _NoAliasLoader(yaml.SafeLoader):
    def __init__(self, stream: str, kind: str) -> None:
        super().__init__(stream)
        self.kind = kind

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.constructor.ConstructorError(
                None, None, f"YAML aliases are not allowed in {self.kind}", event.start_mark
            )
        return super().compose_node(parent, index)


def load_yaml_node(text: str, source: str, kind: str) -> tuple[Any, yaml.Node | None]:
    """(data, node) of the single document in ``text`` (None, None when empty): the node
    lets a caller name the line of a field that fails validation.  ``kind`` names the
    files in the alias refusal ("policy files", "manifests")."""
    loader = _NoAliasLoader(text, kind)
    try:
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None), node
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlSyntax(f"{where}: not valid YAML: {problem}") from None
    finally:
        loader.dispose()


def load_yaml(text: str, source: str, kind: str) -> Any:
    """The single document in ``text`` (None when empty); see :func:`load_yaml_node`."""
    return load_yaml_node(text, source, kind)[0]
