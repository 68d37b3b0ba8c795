"""The web view's pages and what guards them (Starlette, Jinja2 with autoescaping).

Who may use it: the browser opened with the per-launch token (``/?token=...``, as
Jupyter does).  The first request with the token gets it as an HttpOnly, SameSite=Strict
cookie and is redirected to the same page without it; every later request must carry
the cookie.  Requests for another host name than ``127.0.0.1:<port>`` are refused (DNS
rebinding), every change is a POST with the launch's CSRF token and a same-origin
``Origin``, and every page carries a strict Content-Security-Policy: scripts, styles and
images from this server only (nothing remote: it works offline), no inline script, no
framing.  Model- and repository-originated text is escaped by the templates; diffs and
file names are shown as text, links are never made from them.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from fluffy.errors import FluffyError
from fluffy.ui.backend import AUDIT_LIMIT, TIMELINE_LIMIT, Backend
from fluffy.ui.safe import diff_lines, visible, when

HERE = Path(__file__).resolve().parent
COOKIE = "fluffy_ui"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make forms send "Origin: null"
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
#: How often the live view looks for new audit entries (the kernel's head).
LIVE_POLL_S = 1.0
#: A decision's form is a few hundred bytes.
MAX_FORM_BYTES = 64 * 1024
CALL_DECISIONS = {"once": "allow", "session": "allow_session", "deny": "deny"}


def story(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A session's timeline: its states, tool calls, tests, reviews, merges and commit.
    The IPC layer's own entries (``syscall``: the CLI and the AI host reading events and
    jobs) are left to the audit log page, unless policy refused or held one."""
    return [
        e
        for e in entries
        if e.get("event_type") != "syscall"
        or e.get("policy_decision") in ("denied", "review_required")
    ]


def anchors(reviews: list[dict[str, Any]]) -> dict[int, str]:
    """Timeline rows that have a review on the page (its decision, its commit), to the
    review's anchor: a commit links to the diff it took."""
    linked: dict[int, str] = {}
    for review in reviews:
        linked[int(review["id"])] = f"review-{review['id']}"
        if review.get("commit"):
            linked[int(review["commit"]["entry"])] = f"review-{review['id']}"
    return linked


class Launch:
    """The secrets of one `fluffy ui` run, and where it listens."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.token = secrets.token_urlsafe(32)
        self.csrf = secrets.token_urlsafe(32)
        self.host, self.port = host, port

    def url(self, path: str = "/") -> str:
        return f"http://{self.host}:{self.port}{path}?token={self.token}"


def make_app(backend: Backend, launch: Launch) -> Starlette:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is escaped unless a template says otherwise (none do)
    )
    templates = Jinja2Templates(env=env)
    templates.env.filters["visible"] = visible
    templates.env.filters["when"] = when
    templates.env.globals["csrf"] = launch.csrf

    def page(request: Request, name: str, **context: Any) -> Response:
        shown: Response = templates.TemplateResponse(
            request, name, {"project": backend.project, **context}
        )
        return shown

    def sessions(request: Request) -> Response:
        return page(request, "sessions.html", sessions=backend.sessions())

    def records(sid: str, before: str) -> dict[str, Any]:
        """The parts of a session's page that grow while it runs."""
        raw = backend.entries({"session": sid, "before": before})
        reviews = backend.reviews(sid)
        return {
            "sid": sid,
            "timeline": story(raw),
            "older": raw[0]["id"] if len(raw) >= TIMELINE_LIMIT else None,
            "before": before,
            "runs": backend.test_runs(sid),
            "reviews": reviews,
            "anchors": anchors(reviews),
            "diff_lines": diff_lines,
        }

    def session(request: Request) -> Response:
        sid = request.path_params["sid"]
        found = backend.session(sid)
        if found is None:
            return page(request, "missing.html", what=f"no session {sid}")
        return page(
            request,
            "session.html",
            session=found,
            review=backend.review(sid),
            held=backend.held_call(sid),
            **records(sid, str(request.query_params.get("before") or "")),
        )

    def timeline(request: Request) -> Response:
        sid = request.path_params["sid"]
        return page(request, "records.html", **records(sid, ""))

    async def decide(request: Request) -> Response:
        form = await request.form()
        sid = request.path_params["sid"]
        what = str(form.get("what") or "")
        if what in ("approve", "reject"):
            plan = str(form.get("plan_id") or "")
            await asyncio.to_thread(backend.decide_review, sid, plan, what == "approve")
        elif what in CALL_DECISIONS:
            held = str(form.get("review_id") or "")
            await asyncio.to_thread(backend.decide_call, sid, held, CALL_DECISIONS[what])
        else:
            return PlainTextResponse("unknown decision", status_code=400)
        return RedirectResponse(f"/s/{sid}", status_code=303)

    def audit(request: Request) -> Response:
        keys = ("type", "decision", "session", "since", "before")
        chosen = {k: str(request.query_params.get(k) or "") for k in keys}
        found = backend.entries(chosen)
        older = None
        if len(found) >= AUDIT_LIMIT:
            older = urlencode({**{k: v for k, v in chosen.items() if v}, "before": found[0]["id"]})
        newest = urlencode({k: v for k, v in chosen.items() if v and k != "before"})
        return page(request, "audit.html", entries=found, chosen=chosen, older=older, newest=newest)

    def entry(request: Request) -> Response:
        found = backend.entry(int(request.path_params["seq"]))
        if found is None:
            return page(request, "missing.html", what="no such audit entry")
        return page(request, "entry.html", entry=found)

    def verification(request: Request) -> Response:
        return page(request, "verify.html", report=backend.verification())

    def policy(request: Request) -> Response:
        return page(request, "policy.html", policy=backend.policy(), info=backend.environment())

    async def live(request: Request) -> Response:
        async def events() -> Any:
            last = None
            while not await request.is_disconnected():
                try:
                    head = await asyncio.to_thread(backend.head)
                except (FluffyError, OSError):
                    head = "down"
                if head != last:
                    yield f"data: {head}\n\n"
                    last = head
                await asyncio.sleep(LIVE_POLL_S)

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(
        routes=[
            Route("/", sessions),
            Route("/s/{sid:str}", session),
            Route("/s/{sid:str}/timeline", timeline),
            Route("/s/{sid:str}/decide", decide, methods=["POST"]),
            Route("/audit", audit),
            Route("/audit/verify", verification),
            Route("/audit/{seq:int}", entry),
            Route("/policy", policy),
            Route("/live", live),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        exception_handlers={FluffyError: _error_page(templates, backend)},  # type: ignore[dict-item]
    )
    app.add_middleware(Guard, launch=launch)
    return app


def _error_page(
    templates: Jinja2Templates, backend: Backend
) -> Callable[[Request, FluffyError], Awaitable[Response]]:
    async def shown(request: Request, exc: FluffyError) -> Response:
        return templates.TemplateResponse(
            request,
            "error.html",
            {"project": backend.project, "error": exc},
            status_code=502 if exc.code.startswith(("kernel.", "ipc.")) else 400,
        )

    return shown


class Guard:
    """The token (cookie), the host name, the CSRF token and the security headers."""

    def __init__(self, app: Any, launch: Launch) -> None:
        self.app, self.launch = app, launch

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = b""
        if scope.get("method") not in ("GET", "HEAD"):  # read once, to check and to replay
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
                if len(body) > MAX_FORM_BYTES:
                    await _secured(PlainTextResponse("form too large", 413))(scope, receive, send)
                    return

        async def replay() -> Any:
            return {"type": "http.request", "body": body, "more_body": False}

        request = Request(scope, replay)
        refused = await self._refusal(request)
        if refused is not None:
            await _secured(refused)(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, replay if body else receive, with_headers)

    async def _refusal(self, request: Request) -> Response | None:
        launch = self.launch
        host = request.headers.get("host", "")
        if host != f"{launch.host}:{launch.port}":
            return PlainTextResponse("fluffy ui answers on its own address only", 421)
        offered = request.query_params.get("token")
        if offered is not None:
            if not hmac.compare_digest(offered.encode(), launch.token.encode()):
                return PlainTextResponse("wrong token: open the address `fluffy ui` printed", 403)
            kept = request.url.remove_query_params("token")  # the rest of the address stays
            answer = _onward(kept.path + (f"?{kept.query}" if kept.query else ""))
            answer.set_cookie(
                COOKIE, launch.token, httponly=True, samesite="strict", path="/", secure=False
            )
            return answer
        cookie = request.cookies.get(COOKIE, "").encode()  # bytes: any text compares
        if not hmac.compare_digest(cookie, launch.token.encode()):
            return PlainTextResponse(
                "not signed in: open the address `fluffy ui` printed (it carries a token)", 403
            )
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("origin")
            if origin not in (None, f"http://{host}") or not await _csrf_ok(request, launch):
                return PlainTextResponse("refused: not a form of this page", 403)
        return None


def _onward(path: str) -> Response:
    """The page that sends the browser on once the token is a cookie.  Not a redirect:
    a redirect continues the navigation that brought the token (from the redirect file,
    a terminal or another site), and a SameSite=Strict cookie is not sent on a navigation
    another site began; a refresh is this page's own, same-site navigation."""
    shown = html.escape(path, quote=True)
    return HTMLResponse(
        f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={shown}">'
        f'<title>fluffy ui</title><p><a href="{shown}">Continue to fluffy ui</a></p>\n'
    )


async def _csrf_ok(request: Request, launch: Launch) -> bool:
    form = await request.form()
    return hmac.compare_digest(str(form.get("csrf") or "").encode(), launch.csrf.encode())


def _secured(response: Response) -> Response:
    for key, value in HEADERS.items():
        response.headers[key] = value
    return response
