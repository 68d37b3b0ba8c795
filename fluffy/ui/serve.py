"""`fluffy ui`: the view served on 127.0.0.1 beside the project's running kernel, the
browser opened at the per-launch address."""

from __future__ import annotations

import contextlib
import html
import os
import secrets
import shutil
import socket
import tempfile
import webbrowser
from collections.abc import Callable, Iterator
from pathlib import Path

from fluffy.ui.app import Launch, make_app
from fluffy.ui.backend import KernelBackend


def loopback_address() -> str:
    """A loopback address of this run's own (127.x.y.z: Linux answers all of 127/8).
    Browsers keep cookies per host, not per port: on 127.0.0.1 the view's token cookie
    would be sent to every other local server."""
    a, b, c = (secrets.randbelow(254) + 1 for _ in range(3))
    return f"127.{a}.{b}.{c + 1}"  # never 127.x.y.1, a common service address


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def redirect_file(url: str) -> Iterator[Path]:
    """A page only this user can read that sends the browser on to ``url``, as Jupyter
    does: the browser is started with the file's name, so the token is not on its
    command line (which every local user can read in ``ps``).  Removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="fluffy-ui-"))  # 0700
    page = folder / "open.html"
    shown = html.escape(url, quote=True)
    fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(
            '<!doctype html><meta charset="utf-8">'
            f'<meta http-equiv="refresh" content="0;url={shown}">'
            f'<title>fluffy ui</title><p><a href="{shown}">Open fluffy ui</a></p>\n'
        )
    try:
        yield page
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def serve(
    project: Path,
    *,
    port: int = 0,
    open_browser: bool = True,
    say: Callable[[str], None] = print,
    owned: bool = False,
) -> int:
    """Serve until interrupted, the project's kernel running (``owned``: started for the
    view, by the caller, which stops it after)."""
    import uvicorn

    from fluffy.bootstrap.supervisor import paths
    from fluffy.paths import fluffy_home, project_socket

    files = paths(fluffy_home(), str(project))
    host = loopback_address()
    launch = Launch(host=host, port=port or free_port(host))
    backend = KernelBackend(project, project_socket(str(project)), files["state"], files["witness"])
    app = make_app(backend, launch)
    config = uvicorn.Config(
        app, host=launch.host, port=launch.port, log_level="warning", access_log=False,
        lifespan="off", timeout_graceful_shutdown=1,  # an open live stream must not hold Ctrl-C
    )  # fmt: skip
    with redirect_file(launch.url()) as page:
        say(f"fluffy ui for {project}: {launch.url()}")
        say(f"or open {page.as_uri()} (it sends the browser on with the token)")
        say("(the address carries this run's token; Ctrl-C stops the view)")
        if owned:
            say("(the kernel was started for the view: it stops when the view does)")
        if open_browser:
            webbrowser.open(page.as_uri())
        uvicorn.Server(config).run()
    return 0
