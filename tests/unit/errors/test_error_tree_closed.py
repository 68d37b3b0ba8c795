"""One error tree: every exception class fluffy defines is a :class:`FluffyError` defined
in ``fluffy/errors/`` (drawn in docs/errors.md), or is listed below as internal.

An internal exception is control flow: raised and caught within one module or a pair,
and translated there (into the tree's error, a refusal answer, a report line) before
anything reaches a user.  A new exception class outside the tree fails this test until
it joins the tree or is added below with the reason it never reaches a user (a review
point); a listed class that is gone, or that joined the tree, must leave the list (it
stays exact).  The source is read, not imported: the sandboxes and the gate are scanned
too."""

from __future__ import annotations

import ast
import builtins

from fluffy.errors import all_error_classes
from tests.repo_files import ROOT, tracked

#: "path:Class" -> why it never reaches a user (where it is translated)
INTERNAL: dict[str, str] = {
    "sandboxes/nodebuild.py:Refused": (
        "caught in its module: printed as FLUFFY-ENV-ERROR, which the host's build reports"
    ),
    "gate/net.py:Refused": "the gate's dialler answers it as a 403 line to the kernel's proxy",
    "gate/rules.py:Refused": "gate/server.py answers it as a 403 to L1 (the SDK's error mapping)",
    "kernel/audit/verify.py:_Unreadable": "caught in its module: reported as a modified file",
    "kernel/net/allowlist.py:AuthorityError": (
        "each caller translates it: PolicyError, the proxy's 400, a manifest's ValueError"
    ),
    "kernel/ipc/syscalls.py:ResultMismatch": (
        "a kernel bug found with FLUFFY_CHECK_RESULTS=1: the server answers ipc.internal"
    ),
    "kernel/net/dial.py:DialRefused": "kernel/net/proxy.py answers it as a 403 and audits it",
    "kernel/net/head.py:HeadRejected": "kernel/net/proxy.py answers its status and audits it",
    "kernel/policy/request_paths.py:PathEscape": (
        "a deny decision in the policy engine, ToolInputInvalid in the fast path"
    ),
    "kernel/tools/sandbox/pluginjob.py:NeverTaken": (
        "kernel/tools/sandbox/plugins.py catches it and runs the call in a fresh sandbox"
    ),
    "kernel/workflow/baseline.py:_NotRegular": "caught in its module: a warning naming the file",
    "kernel/confined_files.py:FileChanged": (
        "kernel/merge/merger.py and gitmerge.py catch it: a conflict step, rolled back"
    ),
    "kernel/confined_files.py:TargetLocked": (
        "kernel/merge/gitmerge.py catches it: a conflict step naming git's lock"
    ),
    "fluffy/junit.py:_Refused": "caught in its module and raised as EvidenceError",
    "plugins/git_tool/landing.py:LeftOut": "caught in its module: a note on the left-out file",
    "kernel/yamltext.py:YamlSyntax": (
        "each caller raises its own error: PolicyError, ConfigError, PluginManifestYaml"
    ),
    "fluffy/ipc/ai_types.py:ProviderError": (
        "the ai sandbox sends it as a dict; kernel/ai/provider.py failure() maps it to "
        "ProviderFailed, ProviderBusy or ContextTooLong"
    ),
    "sandboxes/ai/transport.py:ProxyRefused": (
        "an httpx.ProxyError that sandboxes/ai/httpio.py maps to a ProviderError"
    ),
}

_BUILTIN = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}
#: the last part of a foreign base that is an exception (httpx.ProxyError, yaml.YAMLError)
_FOREIGN = ("Error", "Exception", "Exit", "Interrupt", "Warning")
_ROOT = "fluffy/errors/tree.py:FluffyError"


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):  # Generic[T] and the like
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _classes(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each class of each source ("path:Class") and the names of its bases."""
    found: dict[str, list[str]] = {}
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, ast.ClassDef):
                found[f"{path}:{node.name}"] = [_base_name(base) for base in node.bases]
    return found


def _kinds(sources: dict[str, str], tree_names: set[str]) -> dict[str, str]:
    """Each exception class ("path:Class") as "tree" or "outside" (others are left out).

    A base is looked up in the class's own module first, then among the tree's classes,
    the builtins and the other modules' classes; a base defined nowhere here is foreign,
    an exception when its name says so."""
    classes = _classes(sources)
    kinds: dict[str, str] = {}
    by_name: dict[str, list[str]] = {}
    for key in classes:
        by_name.setdefault(key.split(":")[1], []).append(key)

    def kind_of_base(path: str, name: str) -> str | None:
        local = f"{path}:{name}"
        if local in classes:
            return "tree" if local == _ROOT else kinds.get(local)
        if name in tree_names:
            return "tree"
        if name in _BUILTIN:
            return "outside"
        known = [kinds[key] for key in by_name.get(name, []) if key in kinds]
        if known:
            return "tree" if "tree" in known else "outside"
        if name not in by_name and name.endswith(_FOREIGN):
            return "outside"
        return None

    changed = True
    while changed:  # to a fixpoint: a class may come before its base
        changed = False
        for key, bases in classes.items():
            path = key.split(":")[0]
            found = {kind_of_base(path, base) for base in bases} - {None}
            kind = "tree" if "tree" in found else ("outside" if found else None)
            if kind is not None and kinds.get(key) != kind:
                kinds[key] = kind
                changed = True
    kinds.pop(_ROOT, None)
    return kinds


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for path in tracked("*.py", skip=("tests/",))
    }


def _tree() -> list[type]:
    """The tree's classes (a test's own FluffyError subclasses left out)."""
    return [cls for cls in all_error_classes() if cls.__module__.startswith("fluffy.errors.")]


def _tree_names() -> set[str]:
    return {cls.__name__ for cls in _tree()}


def test_every_exception_class_is_in_the_tree_or_listed_as_internal() -> None:
    kinds = _kinds(_sources(), _tree_names())
    outside = {key for key, kind in kinds.items() if kind == "outside"}
    unlisted = sorted(outside - set(INTERNAL))
    assert not unlisted, (
        f"exception classes outside the error tree: {unlisted}. Make each a FluffyError in "
        "fluffy/errors/ (it can reach a user), or list it in INTERNAL with the reason it never does"
    )
    stale = sorted(set(INTERNAL) - outside)
    assert not stale, f"listed as internal but no longer an exception outside the tree: {stale}"


def test_each_internal_exception_has_a_one_line_reason() -> None:
    for key, reason in INTERNAL.items():
        assert reason.strip() and "\n" not in reason, key


def test_every_class_of_the_tree_is_defined_in_fluffy_errors() -> None:
    """Only fluffy/errors/ is drawn in docs/errors.md: a FluffyError elsewhere would be a
    code no one can look up."""
    kinds = _kinds(_sources(), _tree_names())
    elsewhere = sorted(
        key
        for key, kind in kinds.items()
        if kind == "tree" and not key.startswith("fluffy/errors/")
    )
    assert not elsewhere, f"FluffyError classes outside fluffy/errors/: {elsewhere}"
    # the scanner agrees with the classes themselves
    defined = {f"{cls.__module__.replace('.', '/')}.py:{cls.__name__}" for cls in _tree()}
    assert {key for key, kind in kinds.items() if kind == "tree"} == defined - {_ROOT}


def test_the_scanner_follows_bases_across_modules() -> None:
    sources = {
        "a.py": (
            "import httpx\nclass Refused(ValueError): pass\nclass Later(Earlier): pass\n"
            "class Earlier(Refused): pass\nclass Proxy(httpx.ProxyError): pass\n"
            "class Plain: pass\nclass Mine(ConfigError): pass\n"
            "class Loader(yaml.SafeLoader): pass\n"
        ),
        "b.py": (
            "from a import Refused\nclass More(Refused): pass\nclass ConfigError(Exception): pass\n"
        ),
        "c.py": "class Own(ConfigError): pass\n",
    }
    assert _kinds(sources, {"ConfigError"}) == {
        "a.py:Refused": "outside",
        "a.py:Earlier": "outside",
        "a.py:Later": "outside",
        "a.py:Proxy": "outside",
        "a.py:Mine": "tree",  # a.py defines no ConfigError: the tree's
        "b.py:More": "outside",
        "b.py:ConfigError": "outside",  # its own bases decide, not its name
        "c.py:Own": "tree",
    }


def _error_payload_codes() -> list[tuple[str, int, str]]:
    """(path, line, code) of each error written by hand: a dict literal with a string
    ``"code"`` beside a ``"what"`` (the shape of :meth:`FluffyError.to_dict`)."""
    found = []
    for path in tracked("*.py", skip=("tests/", "benchmarks/", "scripts/")):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)}  # fmt: skip
            code = keys.get("code")
            if "what" in keys and isinstance(code, ast.Constant) and isinstance(code.value, str):
                found.append((rel, node.lineno, code.value))
    return found


def test_every_error_code_written_by_hand_is_a_code_of_the_tree() -> None:
    # an error built as a dict, not raised, still reaches a user or the model: its code
    # must be one the tree defines (docs/errors.md), not a string of its own
    codes = {cls.code for cls in all_error_classes()}
    strays = [f"{rel}:{line}: {code}" for rel, line, code in _error_payload_codes()
              if code not in codes]  # fmt: skip
    assert strays == [], "\n".join(strays)
