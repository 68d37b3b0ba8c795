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


#: libyaml's parser where PyYAML was built with it (the kernel image's is), several times
#: faster than the pure-Python one, which is the fallback
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_node(text: str, source: str, kind: str) -> tuple[Any, yaml.Node | None]:
    """(data, node) of the single document in ``text`` (None, None when empty): the node
    lets a caller name the line of a field that fails validation.  ``kind`` names the
    files in the alias refusal ("policy files", "manifests")."""
    try:
        for event in yaml.parse(text, Loader=_Loader):  # aliases refused before composing
            if isinstance(event, yaml.AliasEvent):
                mark = event.start_mark  # (libyaml's Mark: the same fields)
                problem = f"YAML aliases are not allowed in {kind}"
                raise yaml.constructor.ConstructorError(None, None, problem, mark)  # type: ignore[arg-type]
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            return (loader.construct_document(node) if node is not None else None), node
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlSyntax(f"{where}: not valid YAML: {problem}") from None


def load_yaml(text: str, source: str, kind: str) -> Any:
    """The single document in ``text`` (None when empty); see :func:`load_yaml_node`."""
    return load_yaml_node(text, source, kind)[0]
