"""The Node major a JavaScript project runs with: read from ``.nvmrc``, ``.node-version``
or ``engines.node`` (an npm range), one of the majors fluffy has wheels for -- and the
same answer for the environment's build and for what the person is shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fluffy.errors import EnvironmentFailed
from fluffy.images.nodeenv import plan_node_environment
from fluffy.kernel.project.envstate import wanted_key
from fluffy.kernel.project.layout import detect_layout
from fluffy.kernel.project.nodeenv import DEFAULT_NODE, node_major, node_test_command
from fluffy.kernel.project.nodelayout import NodeFacts
from fluffy.kernel.project.nodeversion import NODE_MAJORS, choose_node, range_majors
from unit.trees import write_tree

pytestmark = pytest.mark.unit

ALL = tuple(range(14, 31))  # every major, to read the ranges themselves
ENGINES = "package.json (engines.node)"


def _engines(wanted: str, **more: Any) -> dict[str, Any]:
    return {"package.json": {"name": "p", "engines": {"node": wanted}}, **more}


@pytest.mark.parametrize(
    ("wanted", "allowed"),
    [
        ("^22 || ^24 || >=26", [*range(30, 25, -1), 24, 22]),  # nanoid's
        (">=18", list(range(30, 17, -1))),
        (">= 18", list(range(30, 17, -1))),
        ("^18 || ^20", [20, 18]),
        (">=18 <21", [20, 19, 18]),
        (">=14.17.0 <=16", [16, 15, 14]),
        ("^20.9.0", [20]),
        ("~20.1", [20]),
        ("=22", [22]),
        ("v22.1.0", [22]),
        ("18.x", [18]),
        ("18.*", [18]),
        ("18", [18]),
        ("18 - 20", [20, 19, 18]),
        ("18.2 - 20.1.3", [20, 19, 18]),
        (">22 <24", [23]),  # >22 is 23.0.0 and up
        (">22.1.0 <24.0.0", [23, 22]),
        ("<=22", list(range(22, 13, -1))),
        ("<22", list(range(21, 13, -1))),
        (">=20.19 <21 || >=22.12 <23", [22, 20]),
        (">=18.0.0-rc.1", list(range(30, 17, -1))),
        ("*", list(range(30, 13, -1))),
        ("", list(range(30, 13, -1))),
        (">=26", list(range(30, 25, -1))),
    ],
)
def test_an_engines_range_allows_the_majors_npm_would(wanted: str, allowed: list[int]) -> None:
    assert range_majors(wanted, ALL) == allowed


@pytest.mark.parametrize("wanted", ["latest", "node >= 18", ">=18 && <21", "^", "1" * 300])
def test_text_that_is_no_range_is_not_read_as_one(wanted: str) -> None:
    assert range_majors(wanted, ALL) is None


@pytest.mark.parametrize(
    ("files", "major", "source"),
    [
        # the default when the range allows it, not the last alternative's first number
        (_engines("^22 || ^24 || >=26"), DEFAULT_NODE, ENGINES),
        (_engines(">=18"), DEFAULT_NODE, ENGINES),
        (_engines(">=20.11"), DEFAULT_NODE, ENGINES),
        # else the newest major fluffy has that it allows
        (_engines("^18 || ^20"), 20, ENGINES),
        (_engines(">=18 <21"), 20, ENGINES),
        (_engines("^20.9.0"), 20, ENGINES),
        (_engines("18 - 22"), 22, ENGINES),
        (_engines("^22 || ^20"), 22, ENGINES),
        # .nvmrc / .node-version: a version names its major, an alias is the default
        ({".nvmrc": "24\n"}, 24, ".nvmrc"),
        ({".nvmrc": "v20.11.1\n"}, 20, ".nvmrc"),
        ({".nvmrc": "# the team's Node\n22.x  # LTS\n"}, 22, ".nvmrc"),
        ({".node-version": "22\n"}, 22, ".node-version"),
        ({".nvmrc": "lts/*\n"}, DEFAULT_NODE, "fluffy's default"),
        ({".nvmrc": "lts/iron\n"}, DEFAULT_NODE, "fluffy's default"),
        ({".nvmrc": "node\n"}, DEFAULT_NODE, "fluffy's default"),
        ({".nvmrc": "v22.3.0", **_engines(">=18")}, 22, ".nvmrc"),  # the file wins
        # a major fluffy has no wheel for gives way to a range that allows one
        ({".nvmrc": "18\n", **_engines(">=18")}, DEFAULT_NODE, ENGINES),
        # unreadable: noted and passed over
        ({".nvmrc": "¯\\_(ツ)_/¯\n", ".node-version": "20"}, 20, ".node-version"),
        (_engines("latest"), DEFAULT_NODE, "fluffy's default"),
        ({}, DEFAULT_NODE, "fluffy's default"),
    ],
)
def test_the_node_major_is_one_fluffy_has_and_the_files_allow(
    tmp_path: Path, files: dict[str, Any], major: int, source: str
) -> None:
    root = write_tree(tmp_path, files)
    assert major in NODE_MAJORS
    assert node_major(root) == (major, source)


@pytest.mark.parametrize(
    ("files", "source", "asked"),
    [
        (_engines(">=26"), ENGINES, '">=26"'),
        (_engines("^18 || ^19"), ENGINES, '"^18 || ^19"'),
        ({".nvmrc": "v18.19.0\n", "package.json": {"name": "p"}}, ".nvmrc", "Node 18"),
        ({".node-version": "16", **_engines("^16")}, ".node-version", "Node 16"),
    ],
)
def test_a_node_fluffy_does_not_have_stops_the_build_saying_why(
    tmp_path: Path, files: dict[str, Any], source: str, asked: str
) -> None:
    root = write_tree(tmp_path, files)
    with pytest.raises(EnvironmentFailed) as caught:
        node_major(root)
    error = caught.value
    assert asked in error.what and source in (error.why or "")
    assert "20, 22 or 24" in (error.why or "")  # the majors there are
    assert error.fix and source.split(" ")[0] in error.fix
    with pytest.raises(EnvironmentFailed):  # the build plans by the same choice
        plan_node_environment(root, "fluffy/code-executor:x")
    # the kernel looks the environment up without raising (no build made that key)
    assert wanted_key(root, "fluffy/code-executor:x", "javascript") is not None
    layout = detect_layout(root)  # the banner says so, and names no Node
    assert layout.node is not None and layout.node.node is None
    assert any("cannot be built" in note for note in layout.notes)


def test_unreadable_version_files_are_notes_never_errors(tmp_path: Path) -> None:
    root = write_tree(tmp_path, {".nvmrc": "\x00\x01garbage", **_engines("node >= 18")})
    choice = choose_node(root)
    assert (choice.major, choice.source) == (DEFAULT_NODE, "fluffy's default")
    assert any(".nvmrc" in note and "ignored" in note for note in choice.notes)
    assert any("engines.node" in note for note in choice.notes)
    layout = detect_layout(root)
    assert layout.node is not None and layout.node.node == str(DEFAULT_NODE)


@pytest.mark.parametrize(
    "files",
    [
        _engines("^22 || ^24 || >=26"),
        _engines(">=18"),
        _engines("^18 || ^20"),
        _engines(">=18 <21"),
        {".nvmrc": "lts/iron", **_engines("^20")},
        {".nvmrc": "v22.1.0", **_engines(">=18")},
        {".node-version": "18", **_engines(">=18 <23")},
    ],
)
def test_what_the_person_is_shown_is_what_the_build_uses(
    tmp_path: Path, files: dict[str, Any]
) -> None:
    root = write_tree(tmp_path, {**files, "package-lock.json": "{}", "index.js": ""})
    major, _source = node_major(root)
    layout = detect_layout(root)
    assert layout.node is not None and layout.node.node == str(major)
    said = [note for note in layout.notes if note.startswith("Node ")]
    assert said and said[-1].startswith(f"Node {major}")
    assert plan_node_environment(root, "fluffy/code-executor:x").major == major


def test_the_nanoid_range_builds_with_the_default_and_says_so(tmp_path: Path) -> None:
    root = write_tree(tmp_path, _engines("^22 || ^24 || >=26"))
    layout = detect_layout(root)
    assert layout.node is not None and layout.node.node == "24"
    assert 'Node 24: fluffy\'s default, which package.json\'s engines.node "^22 || ^24 || ' \
        '>=26" allows' in layout.notes  # fmt: skip
    assert not any("Node 22" in note or "Node 26" in note for note in layout.notes)


def test_js_runners_get_the_hosts_environment_but_fluffys_path() -> None:
    """A colour variable would change what a suite checks (commander's own colour tests
    fail under NO_COLOR): a runner gets no variable but PATH; colours are stripped."""
    for runner in ("vitest", "jest", None):
        settings = node_test_command(NodeFacts(runner=runner))
        assert settings is not None and set(settings["env"]) <= {"PATH", "FLUFFY_JUNIT"}
