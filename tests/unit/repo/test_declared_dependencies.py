"""What fluffy's own code imports is declared where it runs.

``pip install .`` installs pyproject.toml's dependencies only: a package that arrived
through another one (requests through the docker SDK) can go missing.  Code that runs
only in an image (the ai-provider's HTTP adapters) has that image's requirements
instead, and the host must never import it: `fluffy "task"` crashed with
``ModuleNotFoundError: httpx`` when the CLI took a default URL from the adapters.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
#: The folders of the shipped package (fluffy/ and what it links to; tests and
#: benchmarks are not installed).
SHIPPED = ("fluffy", "kernel", "bootstrap", "gate", "sandboxes", "plugins", "images", "seccomp")
#: Code that runs only in an image, and the requirements it is installed with there.
IMAGE_ONLY = {"sandboxes/ai/": "images/requirements/ai-provider.in"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared(lines: list[str]) -> set[str]:
    return {_name(line) for line in lines if line.strip() and not line.startswith("#")}


def imported_modules() -> dict[str, set[str]]:
    """Top-level third-party module -> the shipped files that import it."""
    found: dict[str, set[str]] = {}
    for folder in SHIPPED:
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "fluffy":
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_third_party_import_is_a_declared_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = _declared(project["dependencies"])
    images = {p: _declared((ROOT / f).read_text().splitlines()) for p, f in IMAGE_ONLY.items()}
    distributions = packages_distributions()
    imported = imported_modules()
    assert {"httpx", "docker", "msgspec"} <= set(imported)  # the walk sees the tree
    missing = {}
    for module, files in imported.items():
        names = {_name(d) for d in distributions.get(module, [module])}
        for file in files:
            image = next((images[p] for p in IMAGE_ONLY if file.startswith(p)), None)
            if not names & (declared if image is None else image):
                missing.setdefault(module, []).append(file)
    assert not missing, f"imported but not declared where the code runs: {missing}"


def test_the_cli_reads_the_providers_urls_without_their_http_client() -> None:
    code = (
        "import sys; sys.modules['httpx'] = None  # as if not installed\n"
        "from fluffy.cli.endpoint import public_url\n"
        "assert public_url('openai').startswith('https://api.openai.com')\n"
        "assert public_url('anthropic') == 'https://api.anthropic.com'\n"
        "from fluffy.sandboxes.ai.openai import DEFAULT_BASE_URL\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1 and "import of httpx halted" in done.stderr, done.stderr
    first = code.rsplit("from fluffy.sandboxes", 1)[0]  # all but the adapters' import
    assert subprocess.run([sys.executable, "-c", first], capture_output=True).returncode == 0
