"""`fluffy ui`'s guards and pages against a stand-in backend: the per-launch token, the
host name, CSRF, the Content-Security-Policy, and hostile text shown inert.

(tests/e2e drives the real view in a headless Chromium against a real kernel.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fluffy.ui.app import COOKIE, CSP, Launch, make_app

pytestmark = pytest.mark.unit

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
DIFF = (
    "--- a/src/app.py\n+++ b/src/app.py\n@@ -1 +1 @@\n-x = 1\n"
    f"+x = 2  # {HOSTILE} \u202egnp.exe\n"
    "--- /dev/null\n+++ b/javascript:alert(1)//.py\n@@ -0,0 +1 @@\n+\x1b[31mred\n"
)


class Backend:
    def __init__(self, project: Path) -> None:
        self.project = project
        self.decided: list[tuple[str, str, str, Any]] = []
        self.filters: list[dict[str, str]] = []
        self.state = "reviewing"

    def sessions(self) -> list[dict[str, Any]]:
        return [{"session_id": "s1", "mode": "strict", "state": self.state, "turns": 2,
                 "title": HOSTILE, "quarantined": False}]  # fmt: skip

    def session(self, session_id: str) -> dict[str, Any] | None:
        if session_id != "s1":
            return None
        return {"session_id": "s1", "mode": "strict", "state": self.state}

    def review(self, session_id: str) -> dict[str, Any] | None:
        if self.state != "reviewing":
            return None
        return {"plan_id": "p" * 32, "files": ["src/app.py"], "diff_lines": 2,
                "reasons": [f"sensitive: {HOSTILE}"], "diff": DIFF}  # fmt: skip

    def held_call(self, session_id: str) -> dict[str, Any] | None:
        return {"review_id": "r1", "tool": "mcp.evil.tool", "reason": HOSTILE,
                "arguments": '{"url": "javascript:alert(1)"}'}  # fmt: skip

    def decide_review(self, session_id: str, plan_id: str, approve: bool) -> dict[str, Any]:
        self.decided.append(("review", session_id, plan_id, approve))
        self.state = "committing" if approve else "code_writing"
        return {}

    def decide_call(self, session_id: str, review_id: str, decision: str) -> dict[str, Any]:
        self.decided.append(("call", session_id, review_id, decision))
        return {}

    def entries(self, filters: dict[str, str]) -> list[dict[str, Any]]:
        self.filters.append(filters)
        return [{"id": 7, "timestamp": 1_764_300_000_000, "event_type": "tool_result",
                 "tool_name": "fs.write", "syscall_type": None, "policy_decision": "denied",
                 "policy_rule_name": "deny-src", "sandbox_id": "abc", "input_summary": "",
                 "output_summary": HOSTILE, "deny_reason": None}]  # fmt: skip

    def entry(self, seq: int) -> dict[str, Any] | None:
        return {"id": seq, "input_summary": HOSTILE} if seq == 7 else None

    def test_runs(self, session_id: str) -> list[dict[str, Any]]:
        return [{"id": 1, "timestamp": 1_764_300_000_000, "state": "test_writing",
                 "exit_code": 1, "green": False, "more_failing": 0,
                 "counts": {"passed": 0, "failed": 1, "error": 0, "skipped": 0},
                 "failing": [{"id": f"tests/test_x.py::test_{HOSTILE}", "outcome": "failed",
                              "message": f"AssertionError: {HOSTILE}"}]},
                {"id": 2, "timestamp": 1_764_300_060_000, "state": "code_writing",
                 "exit_code": 0, "green": True, "more_failing": 0, "failing": [],
                 "counts": {"passed": 3, "failed": 0, "error": 0, "skipped": 0}}]  # fmt: skip

    def reviews(self, session_id: str) -> list[dict[str, Any]]:
        return [{"id": 40, "timestamp": 1_764_300_100_000, "kind": "rejected", "by": "",
                 "files": ["src/app.py"], "diff": DIFF, "cut": False, "commit": None,
                 "kept": "whole",
                 "summary": "merge rejected by the user"},
                {"id": 50, "timestamp": 1_764_300_200_000, "kind": "approved", "by": "user",
                 "files": ["src/app.py", HOSTILE], "diff": DIFF, "cut": True, "kept": "preview",
                 "commit": {"sha": "c0ffee" * 6 + "abcd", "entry": 7, "message": HOSTILE},
                 "summary": "merge approved by user"}]  # fmt: skip

    def verification(self) -> dict[str, Any]:
        return {"ok": True, "entries": 7, "witness": {"seq": 7, "hash": "ab" * 32},
                "unwitnessed": None, "warnings": [], "problem": None}  # fmt: skip

    def policy(self) -> dict[str, Any]:
        return {"path": "/p/.fluffy/policy.yaml", "text": f"# {HOSTILE}\n", "default": False}

    def environment(self) -> dict[str, Any]:
        return {"environment": {"image": "fluffy/env:x", "note": HOSTILE}}

    def head(self) -> str:
        return "7:ab"


@pytest.fixture
def ui(tmp_path: Path) -> tuple[TestClient, Launch, Backend]:
    launch = Launch(port=8765)
    backend = Backend(tmp_path / "project")
    client = TestClient(make_app(backend, launch), base_url="http://127.0.0.1:8765")
    return client, launch, backend


def _signed_in(client: TestClient, launch: Launch) -> None:
    first = client.get(f"/?token={launch.token}", follow_redirects=False)
    # a page of its own sends the browser on: a redirect would carry on the navigation
    # that brought the token, and a SameSite=Strict cookie is not sent on a navigation
    # begun elsewhere (the redirect file, another site)
    assert first.status_code == 200 and 'http-equiv="refresh" content="0;url=/"' in first.text
    cookie = first.headers["set-cookie"]
    assert f"{COOKIE}={launch.token}" in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")


def test_nothing_is_served_without_the_launch_s_token(ui: Any) -> None:
    client, launch, _ = ui
    for path in ("/", "/s/s1", "/audit", "/audit/7", "/policy", "/live", "/static/ui.js"):
        refused = client.get(path)
        assert refused.status_code == 403, path
        assert refused.headers["content-security-policy"] == CSP
    assert client.get("/?token=" + "x" * 43).status_code == 403
    client.cookies.set(COOKIE, "x" * 43)
    assert client.get("/").status_code == 403
    client.cookies.clear()
    deep = client.get(f"/audit?type=policy_update&token={launch.token}", follow_redirects=False)
    assert 'content="0;url=/audit?type=policy_update"' in deep.text  # only the token leaves
    client.cookies.clear()
    _signed_in(client, launch)
    shown = client.get("/")
    assert shown.status_code == 200 and shown.headers["content-security-policy"] == CSP
    assert shown.headers["x-frame-options"] == "DENY"
    assert shown.headers["referrer-policy"] == "same-origin"


def test_another_host_name_is_refused_even_with_the_token(ui: Any) -> None:
    client, launch, _ = ui
    _signed_in(client, launch)
    # a page of evil.example whose name resolves to 127.0.0.1 (DNS rebinding)
    rebound = client.get("/", headers={"host": "evil.example:8765"})
    assert rebound.status_code == 421


def test_a_decision_needs_this_page_s_form(ui: Any) -> None:
    client, launch, backend = ui
    _signed_in(client, launch)
    form = {"what": "approve", "plan_id": "p" * 32}
    assert client.post("/s/s1/decide", data=form).status_code == 403  # no CSRF token
    wrong = {**form, "csrf": "y" * 43}
    assert client.post("/s/s1/decide", data=wrong).status_code == 403
    other = {"origin": "http://evil.example"}
    good = {**form, "csrf": launch.csrf}
    assert client.post("/s/s1/decide", data=good, headers=other).status_code == 403
    assert backend.decided == []
    done = client.post("/s/s1/decide", data=good, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/s/s1"
    assert backend.decided == [("review", "s1", "p" * 32, True)]
    held = {"what": "session", "review_id": "r1", "csrf": launch.csrf}
    assert client.post("/s/s1/decide", data=held, follow_redirects=False).status_code == 303
    assert backend.decided[-1] == ("call", "s1", "r1", "allow_session")


def test_hostile_text_is_shown_as_text(ui: Any) -> None:
    client, launch, _ = ui
    _signed_in(client, launch)
    for path in ("/", "/s/s1", "/s/s1/timeline", "/audit", "/audit/7", "/policy"):
        html = client.get(path).text
        assert "<script>alert" not in html and "<img src=x" not in html, path
        assert 'href="javascript:' not in html and "onerror=alert(1)>" not in html, path
        # the only scripts are this server's own file, none inline
        assert "<script" not in html.replace('<script src="/static/ui.js" defer>', ""), path
        if path != "/s/s1/timeline":  # (a part of the page, fetched by the page's script)
            assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/ui.js" defer>']
    page = client.get("/s/s1").text
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page
    assert "&lt;U+202E&gt;gnp.exe" in page  # the direction override named, not obeyed
    assert "&lt;U+001B&gt;[31mred" in page  # a terminal escape too
    assert "javascript:alert(1)//.py" in page  # a file name as text, never a link
    assert 'name="csrf" value="' + launch.csrf + '"' in page


def test_pages_show_the_session_the_audit_log_and_the_policy(ui: Any) -> None:
    client, launch, backend = ui
    _signed_in(client, launch)
    session = client.get("/s/s1").text
    assert 'id="approve"' in session and "deny-src" in session and "2025-11-28" in session
    missing = client.get("/s/nope")
    assert missing.status_code == 200 and "no session nope" in missing.text
    client.get("/audit?type=tool_result&decision=denied&session=s1&since=2h")
    assert backend.filters[-1] == {"type": "tool_result", "decision": "denied",
                                   "session": "s1", "since": "2h", "before": ""}  # fmt: skip
    assert "Intact: 7 entries checked" in client.get("/audit/verify").text
    assert "fluffy/env:x" in client.get("/policy").text
    assert client.get("/static/ui.css").status_code == 200


def test_a_session_shows_its_test_runs_reviews_and_commit(ui: Any) -> None:
    client, launch, _ = ui
    _signed_in(client, launch)
    page = client.get("/s/s1").text
    tests = page[page.index('id="tests"') : page.index('id="reviews"')]
    assert tests.count('class="run red"') == 1 and tests.count('class="run green"') == 1
    assert "0 passed, 1 failed" in tests and "3 passed, 0 failed" in tests
    assert "AssertionError: &lt;script&gt;" in tests  # the failing test's message, as text
    reviews = page[page.index('id="reviews"') : page.index('id="timeline"')]
    assert reviews.index('id="review-40"') < reviews.index('id="review-50"')
    assert "<strong>rejected</strong>" in reviews and "<strong>approved</strong>" in reviews
    approved = reviews[reviews.index('id="review-50"') :]
    assert "c0ffeec0ffee</code>" in approved  # the commit, beside the diff it took
    assert f"git show {'c0ffee' * 6}abcd" in approved  # the diff was cut: where all of it is
    assert approved.count('class="add"') == 2 and approved.count('class="del"') == 1
    # the commit's timeline row links to its review and diff
    timeline = page[page.index('id="timeline"') :]
    assert '<a href="#review-50" class="to-review">' in timeline
    # the live refresh fetches the same parts of the page
    part = client.get("/s/s1/timeline").text
    assert 'id="review-50"' in part and 'id="run-2"' in part and "<html" not in part


def test_the_audit_page_and_a_long_timeline_page_back(ui: Any, monkeypatch: Any) -> None:
    import fluffy.ui.app as app

    client, launch, backend = ui
    _signed_in(client, launch)
    monkeypatch.setattr(app, "AUDIT_LIMIT", 1)
    monkeypatch.setattr(app, "TIMELINE_LIMIT", 1)
    page = client.get("/audit?type=tool_result&before=").text
    assert '<a href="/audit?type=tool_result&amp;before=7" id="older">' in page
    older = client.get("/audit?type=tool_result&before=7").text
    assert backend.filters[-1]["before"] == "7" and backend.filters[-1]["type"] == "tool_result"
    assert '<a href="/audit?type=tool_result" id="newest">' in older
    session = client.get("/s/s1").text
    assert '<a href="/s/s1?before=7" id="older">' in session
    back = client.get("/s/s1?before=7").text
    assert backend.filters[-1] == {"session": "s1", "before": "7"}
    assert "data-refresh=" not in back  # an older page is not refreshed with new entries


def test_the_browser_is_sent_on_by_a_file_only_this_user_reads() -> None:
    # the browser starts with the file's name: the token is not on its command line
    import stat

    from fluffy.ui.serve import redirect_file

    url = 'http://127.1.2.3:5000/?token=abc"><script>x</script>'
    with redirect_file(url) as page:
        assert stat.S_IMODE(page.stat().st_mode) == 0o600
        assert stat.S_IMODE(page.parent.stat().st_mode) == 0o700
        text = page.read_text()
        shown = "http://127.1.2.3:5000/?token=abc&quot;&gt;&lt;script&gt;x&lt;/script&gt;"
        assert f'content="0;url={shown}"' in text and "<script" not in text
    assert not page.parent.exists()


def test_the_live_signal_ignores_the_ipc_layer_s_own_entries(tmp_path: Path) -> None:
    # the view's own reads are audited `syscall` entries: were they the signal, an open
    # page would refetch, be audited, and refetch again, forever
    import asyncio

    from fluffy.kernel.audit.entry import Event
    from fluffy.kernel.audit.log import AuditLog
    from fluffy.ui.backend import KernelBackend

    state = tmp_path / "state"
    backend = KernelBackend(tmp_path, tmp_path / "none.sock", state)

    async def record(*events: Event) -> None:
        audit = await AuditLog.open(state)
        for event in events:
            await audit.record(event)
        await audit.close()

    asyncio.run(record(Event("kernel_start")))
    first = backend.head()
    asyncio.run(record(Event("syscall", syscall_type="session.get", policy_decision="allowed")))
    assert backend.head() == first
    asyncio.run(record(Event("policy_update")))
    assert backend.head() != first
    assert backend.entry(3)["event_type"] == "policy_update"  # one entry, by its seq
    assert backend.entry(99) is None
