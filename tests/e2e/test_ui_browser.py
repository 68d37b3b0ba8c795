"""`fluffy ui` in a real headless Chromium (Debian's) against a real kernel (L1) and
sandboxes: a session whose merge waits for the person is approved from the page, and
the commit lands; the AI's hostile text in the diff stays text.

Playwright drives the system browser (its own browser download cannot be had here).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fluffy.demo_session import git
from tests.conftest import unavailable
from tests.e2e.project_kernel import reviewed_script, user_project

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-project"
FLUFFY = str(Path(sys.executable).parent / "fluffy")
CHROMIUM = "/usr/bin/chromium"
#: What a hostile model writes into a file it changes.
HOSTILE = "<script>alert('pwned')</script> <img src=x onerror=alert(1)> \u202eexe.txt"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def _run(argv: list[str], project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FLUFFY, *argv], cwd=project, env=env, capture_output=True, text=True, timeout=600,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _address(ui: subprocess.Popen[str]) -> str:
    """The file `fluffy ui` prints beside its address, that sends a browser on to it."""
    assert ui.stdout is not None
    deadline = time.monotonic() + 60
    seen = ""
    while time.monotonic() < deadline:
        line = ui.stdout.readline()
        seen += line
        found = re.search(r"file:///\S+/open\.html", line)
        if found and re.search(r"http://127\.\d+\.\d+\.\d+:\d+/\?token=[\w-]+", seen):
            return found.group(0)
        assert line or ui.poll() is None, f"fluffy ui ended: {seen}"
    raise AssertionError(f"fluffy ui printed no address: {seen}")


def test_a_review_is_approved_in_the_browser_and_the_commit_lands(
    engine: object, images: dict[str, str], tmp_path: Path
) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        unavailable("Debian's chromium is not installed (scripts/setup --with-browser)")
    project, env = user_project(tmp_path, images["kernel"])
    started = _run(["start"], project, env)
    assert started.returncode == 0, started.stdout + started.stderr
    ui: subprocess.Popen[str] | None = None
    try:
        script = reviewed_script(tmp_path, f"# {HOSTILE}")
        task = _run(["Add error handling to parseConfig", "--script", str(script)], project, env)
        assert "waits for your review" in task.stdout + task.stderr, task.stdout + task.stderr
        sid = re.search(r"session ([0-9a-f]{12})", task.stdout + task.stderr)
        assert sid is not None
        ui = subprocess.Popen(
            [FLUFFY, "ui", "--no-open"], cwd=project, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        address = _address(ui)
        with playwright.sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page()
            dialogs: list[str] = []
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(address)  # the redirect file (the token not on a command line)
            page.wait_for_url(re.compile(r"^http://127\.\d+\.\d+\.\d+:\d+/$"))
            assert "token=" not in page.url  # the token went into a cookie
            page.click(f"a[href='/s/{sid.group(1)}']")
            page.wait_for_selector("#review")
            diff = page.inner_text("pre.diff")
            assert "<script>alert('pwned')</script>" in diff  # shown, as text
            assert "<U+202E>exe.txt" in diff  # the direction override named
            assert (
                page.locator("main img").count() == 0 and page.locator("main script").count() == 0
            )
            shots = Path(os.environ.get("FLUFFY_SCREENSHOTS") or tmp_path)  # README's pictures
            page.set_viewport_size({"width": 1280, "height": 900})
            page.screenshot(path=str(shots / "ui-review.png"))
            page.click("#approve")
            page.wait_for_load_state()
            assert page.locator("#state").count() == 1, page.url + page.content()[-3000:]
            deadline = time.monotonic() + 300
            while "idle" not in (page.text_content("#state", timeout=5000) or ""):
                assert time.monotonic() < deadline, page.inner_text("main")[-2000:]
                assert page.locator("#state").count() == 1, page.inner_text("main")[-2000:]
                page.wait_for_timeout(1000)
                page.reload()
            timeline = page.inner_text("#timeline")
            assert "merge" in timeline and "git.commit" in timeline
            # the tests went red (each failing test named), then green
            runs = page.locator("#tests div.run")
            assert page.locator("#tests div.run.red ul.failing li").count() >= 1
            assert "green" in runs.last.inner_text(), page.inner_text("#tests")
            # the approved change, with its whole diff and the commit that took it
            review = page.locator("#reviews details.review-approved")
            while review.locator("code.commit").count() == 0:  # the commit's result follows
                assert time.monotonic() < deadline, page.inner_text("#reviews")
                page.wait_for_timeout(500)
                page.reload()
            assert review.count() == 1, page.inner_text("#reviews")
            shown_sha = review.locator("code.commit").inner_text()
            review.locator("summary").click()
            merged = review.locator("pre.diff").inner_text()
            assert "pyproject.toml" in merged and "<script>alert('pwned')</script>" in merged
            assert "ConfigError" in merged  # beyond the audit entry's 500-character preview
            linked = page.locator("#timeline a.to-review").first.get_attribute("href")
            assert linked == "#" + (review.get_attribute("id") or "-")
            page.screenshot(path=str(shots / "ui-merged.png"))
            assert dialogs == []  # nothing the model wrote ever ran
            browser.close()
    finally:
        if ui is not None:
            ui.terminate()
            ui.communicate(timeout=60)  # (reads and closes its output)
        _run(["stop"], project, env)
    log = git(project, "-c", "safe.directory=*", "log", "--format=%H %s")
    assert log.splitlines()[0].split(" ", 1)[1] == "Add error handling to parseConfig"
    assert log.startswith(shown_sha)  # the page named the commit that landed
    assert HOSTILE in (project / "pyproject.toml").read_text()
