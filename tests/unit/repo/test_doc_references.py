"""Every reference in the repository resolves inside it: the design is vendored in
docs/design/, markdown links point at files that exist, and nothing cites a path outside
the repository (the commissioning folder a clone does not have)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.repo_files import ROOT, tracked

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
DESIGN_PATH = re.compile(r"docs/design/[A-Za-z0-9_.-]+\.md")
OUTSIDE = re.compile(r"\.\./shared/|/work/shared/")


def _tracked(*patterns: str) -> list[Path]:
    return tracked(*patterns, skip=("docs/design/",))  # the vendored design is cited, not read


def test_the_design_is_vendored() -> None:
    design = ROOT / "docs" / "design"
    names = {p.name for p in design.glob("*.md")}
    assert {"fluffy-waffle-architecture.md", "design-card.md"} <= names
    assert "## " in (design / "fluffy-waffle-architecture.md").read_text(encoding="utf-8")


def test_markdown_links_resolve() -> None:
    broken = []
    for doc in _tracked("*.md"):
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).resolve().exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_design_paths_cited_in_code_and_docs_exist() -> None:
    missing, outside = [], []
    for path in _tracked("*.py", "*.md", "*.toml", "*.yaml", "*.sh", "scripts/*"):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        missing += [f"{path.relative_to(ROOT)}: {m}" for m in DESIGN_PATH.findall(text)
                    if not (ROOT / m).is_file()]  # fmt: skip
        if path.name != Path(__file__).name and OUTSIDE.search(text):
            outside.append(str(path.relative_to(ROOT)))
    assert not missing, missing
    assert not outside, f"cite docs/design/ instead of a path outside the repository: {outside}"
