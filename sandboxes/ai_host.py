"""The ai-provider host: runs the model requests of one session turn, inside an L2 sandbox.

``python3 -m fluffy.sandboxes.ai_host`` scrubs its environment, tightens its seccomp
filter (no execve from here on: the strict profile already forbids new processes and
network sockets), connects to ``/run/fluffy/kernel.sock`` and loops:

* ``ai.next`` gives a request (None: exit 0): the provider's config (with the API key,
  which reaches this sandbox only), the messages and the tool definitions;
* the adapter streams the answer in a worker thread; its events go back in order, a
  batch per ``ai.event`` call, and the whole response as ``ai.result``.

The only way out of the sandbox is the kernel's CONNECT proxy, a Unix socket in the
same mounted folder (``/run/fluffy/proxy.sock``): the HTTP client tunnels every request
through it in-process (socat cannot run here: no new processes, no AF_INET sockets).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import msgspec

from fluffy.errors import FluffyError
from fluffy.ipc.ai_types import (
    Done,
    ProviderConfig,
    ProviderError,
    StreamEvent,
    decode_messages,
    decode_tools,
)
from fluffy.ipc.client import AsyncClient
from fluffy.plugins.sdk.run import scrub_environment

SOCKET = "/run/fluffy/kernel.sock"
PROXY = "/run/fluffy/proxy.sock"
#: Events are sent in batches: at most this many per ``ai.event`` call.
BATCH = 64


def _log(message: str) -> None:
    print(f"ai_host: {message}", file=sys.stderr, flush=True)


def _client_for(config: ProviderConfig, proxy: str) -> Any:
    if config.name == "scripted":
        return None
    from fluffy.sandboxes.ai.transport import make_client

    return make_client(f"unix://{proxy}", timeout_s=config.timeout_s)


def run_request(
    job: dict[str, Any],
    proxy: str,
    emit: Callable[[StreamEvent], None],
    *,
    client_for: Callable[[ProviderConfig, str], Any] = _client_for,
) -> dict[str, Any]:
    """One model request, streamed through ``emit``; returns the ``ai.result`` body.

    One attempt only: a failure goes back with its kind and the wait the provider asked
    for, and the kernel's retry policy decides (ADR-044).  ``client_for`` is the network
    path (tests: a plain loopback client).
    """
    from fluffy.sandboxes.ai.adapters import make_adapter

    started = time.perf_counter()
    job_id = job.get("job_id")
    try:
        config = msgspec.convert(job.get("provider") or {}, ProviderConfig)
        messages = decode_messages(job.get("messages") or [])
        tools = decode_tools(job.get("tools") or [])
        client = client_for(config, proxy)
        try:
            adapter = make_adapter(config, client)
            response = None
            for event in adapter.chat_stream(messages, tools):
                if isinstance(event, Done):
                    response = event.response
                else:
                    emit(event)
        finally:
            if client is not None:
                client.close()
        if response is None:
            raise ProviderError("the provider's stream ended without a response", retryable=True)
        return {
            "job_id": job_id,
            "ok": True,
            "response": msgspec.to_builtins(response),
            "duration_ms": (time.perf_counter() - started) * 1000,
        }
    except ProviderError as exc:
        return {"job_id": job_id, "ok": False, "error": exc.to_dict()}
    except msgspec.ValidationError as exc:
        return {
            "job_id": job_id,
            "ok": False,
            "error": {"what": f"the kernel's request is malformed: {exc}", "retryable": False},
        }
    except Exception as exc:  # a bug in an adapter: still an answer
        traceback.print_exc(file=sys.stderr)
        return {
            "job_id": job_id,
            "ok": False,
            "error": {
                "what": f"the provider adapter failed: {type(exc).__name__}",
                "why": str(exc)[:300],
                "retryable": False,
            },
        }


class Host:
    def __init__(self, socket: str, proxy: str) -> None:
        self.socket = socket
        self.proxy = proxy

    async def _pump(
        self, client: AsyncClient, job_id: Any, queue: asyncio.Queue[StreamEvent | None]
    ) -> None:
        """Send the worker's events in order, batching what piled up meanwhile."""
        while True:
            first = await queue.get()
            if first is None:
                return
            batch = [first]
            finished = False
            while len(batch) < BATCH and not queue.empty():
                item = queue.get_nowait()
                if item is None:
                    finished = True
                    break
                batch.append(item)
            events = [msgspec.to_builtins(e) for e in batch]
            await client.call("ai.event", {"job_id": job_id, "events": events})
            if finished:
                return

    def _work(
        self,
        job: dict[str, Any],
        emit: Callable[[StreamEvent], None],
        result: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        queue: asyncio.Queue[StreamEvent | None],
    ) -> None:
        try:
            result.update(run_request(job, self.proxy, emit))
        finally:  # after the result: the pump's end means it is there
            loop.call_soon_threadsafe(queue.put_nowait, None)

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        client = await AsyncClient.connect(self.socket, plugin_name="ai-provider")
        try:
            while True:
                job = await client.call("ai.next")
                if job is None:
                    return 0
                queue: asyncio.Queue[StreamEvent | None] = asyncio.Queue()

                def emit(event: StreamEvent, q: asyncio.Queue[StreamEvent | None] = queue) -> None:
                    loop.call_soon_threadsafe(q.put_nowait, event)

                pump = asyncio.ensure_future(self._pump(client, job.get("job_id"), queue))
                result: dict[str, Any] = {}
                # one thread, no pool: the ai-provider template allows 10 pids in all
                threading.Thread(
                    target=self._work, args=(job, emit, result, loop, queue), daemon=True
                ).start()
                await pump
                await client.call("ai.result", result)
        finally:
            await client.close()


def main(argv: list[str] | None = None) -> int:
    scrub_environment()  # the key comes over the socket, never through the environment
    parser = argparse.ArgumentParser(prog="python3 -m fluffy.sandboxes.ai_host")
    parser.add_argument("--socket", default=SOCKET)
    parser.add_argument("--proxy", default=PROXY)
    parser.add_argument(
        "--no-tighten", action="store_true", help="tests outside a sandbox: keep the filter"
    )
    args = parser.parse_args(argv)
    if not args.no_tighten:
        from fluffy.sandboxes.tighten import tighten

        tighten("strict")  # no execve from here on
    try:
        return asyncio.run(Host(args.socket, args.proxy).serve())
    except (FluffyError, OSError) as exc:
        _log(f"stopped: {type(exc).__name__}: {exc}")
        return 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    os._exit(130)
