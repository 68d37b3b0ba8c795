"""HTTP for the adapters: one POST (JSON or SSE) and the mapping of failures to ProviderError.

Every failure leaves here as a :class:`ProviderError` whose text was built from the
status, the host and the provider's own message, with the API key redacted; request
headers are never rendered and the httpx exception is not chained (its request carries
the key in a header).  ``retryable`` is set for what a later attempt may fix: rate
limits, 408/409, 5xx (529: Anthropic overloaded), timeouts, refused connections and
streams that drop mid-way; ``kind`` says which, and ``retry_after_s`` carries the wait
the provider asked for (``retry-after-ms``, else ``Retry-After`` in seconds or as an
HTTP date).  The sandbox never waits itself: the kernel's retry policy does, so a
cancelled turn stops waiting at once (ADR-044).  A prompt too long for the model's
window is its own kind (``context_length``): the kernel compacts, it does not retry.

The kernel's egress proxy refuses a host outside ``policy.yaml`` ``network_whitelist``
by answering the CONNECT with 403; httpx's proxy support and the sandbox's tunnelling
transport (:mod:`fluffy.sandboxes.ai.transport`) both raise an ``httpx.ProxyError``
whose text starts with the status ("403 ...").
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Generator, Mapping
from typing import Any, TypeVar

import httpx
import msgspec

from fluffy.ipc.ai_types import ProviderError
from fluffy.sandboxes.ai.sse import SSEEvent, iter_lines, iter_sse

T = TypeVar("T")

KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
#: How much of a provider's error message is quoted.
MESSAGE_CHARS = 300
# key-shaped tokens a provider may echo back ("Incorrect API key provided: sk-...")
_KEYLIKE = re.compile(r"\b(?:sk|pk|key|ak)-[A-Za-z0-9_*.\-]{6,}")


def redact(text: str, secret: str) -> str:
    if secret:
        text = text.replace(secret, "[redacted]")
    return _KEYLIKE.sub("[redacted]", text)


def safe_url(url: str) -> str:
    """The URL without user info or query (which could hold credentials)."""
    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return "(invalid URL)"
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{u.host}{port}{u.path}"


def _host(url: str) -> str:
    try:
        return httpx.URL(url).host or url
    except (httpx.InvalidURL, TypeError):
        return "(invalid URL)"


def provider_message(body: bytes) -> str:
    """The human part of an error body: ``{"error": {"message": ...}}`` or ``{"error": "..."}``."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body.decode("utf-8", "replace").strip()[:MESSAGE_CHARS]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            message = error.get("message") or error.get("type") or ""
            return str(message)[:MESSAGE_CHARS]
        if isinstance(error, str):
            return error[:MESSAGE_CHARS]
    return ""


def provider_code(body: bytes) -> str:
    """The machine part of an error body: ``error.code`` (OpenAI) or ``error.type``."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        return str(error.get("code") or error.get("type") or "")
    return ""


#: How providers say a prompt does not fit: OpenAI's code and message, Anthropic's
#: "prompt is too long", and the words of the compatible local servers.
_TOO_LONG = re.compile(
    r"context[_ ]length|prompt is too long|maximum context|context window|too many tokens"
    r"|exceeds? the (?:model'?s? )?(?:context|maximum)",
    re.IGNORECASE,
)


def is_context_length(code: str, message: str) -> bool:
    return code == "context_length_exceeded" or bool(_TOO_LONG.search(message))


def context_too_long(why: str) -> ProviderError:
    return ProviderError(
        "the conversation is too long for the model's context window",
        why=why,
        fix="fluffy compacts the conversation once and retries; if it still does not fit, "
        "start a new session or set context_window to the model's real window "
        "(`fluffy config set context_window N`).",
        kind="context_length",
    )


#: A Retry-After beyond this is not a wait, it is a mistake (or a day-long ban).
MAX_RETRY_AFTER_S = 86_400.0


def retry_after(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The wait asked for, in seconds: ``retry-after-ms``, else ``Retry-After`` as
    seconds or an HTTP date; None when there is none (or it does not parse)."""
    raw_ms = (headers.get("retry-after-ms") or "").strip()
    if raw_ms:
        try:
            value = float(raw_ms) / 1000
        except ValueError:
            value = -1.0
        if 0 <= value <= MAX_RETRY_AFTER_S:
            return value
    raw = (headers.get("retry-after") or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        value = when.timestamp() - (time.time() if now is None else now)
        value = max(value, 0.0)
    return value if 0 <= value <= MAX_RETRY_AFTER_S else None


def _waited(what: str, wait: float | None) -> str:
    return f"{what} (it asked to retry after {wait:g}s)" if wait is not None else what


def status_error(provider: str, response: httpx.Response, url: str, api_key: str) -> ProviderError:
    """A non-2xx answer as a ProviderError (the body must have been read)."""
    status = response.status_code
    host = _host(url)
    message = redact(provider_message(response.content), api_key)
    said = f"{host} answered {status}" + (f": {message}" if message else "")
    env = KEY_ENV.get(provider, "the provider's API key variable")
    wait = retry_after(response.headers)
    if status in (401, 403):
        return ProviderError(
            "the provider refused the API key",
            why=said,
            fix=f"Set {env} to a valid key for {host} (and check that the key may use "
            "this model), then retry.",
            kind="auth",
        )
    if status == 404:
        return ProviderError(
            "the provider has no such model or endpoint",
            why=f"{safe_url(url)} answered 404" + (f": {message}" if message else ""),
            fix="Check the provider's model name and base_url in the fluffy configuration.",
            kind="request",
        )
    if status in (400, 413) and is_context_length(provider_code(response.content), message):
        return context_too_long(said)
    if status == 429:
        return ProviderError(
            "the provider is rate limiting requests",
            why=_waited(said, wait),
            fix="Wait and retry, or lower the request rate / raise the account's limits.",
            retryable=True,
            kind="rate_limit",
            retry_after_s=wait,
        )
    overloaded = status == 529 or provider_code(response.content) == "overloaded_error"
    if status in (408, 409) or status >= 500:
        return ProviderError(
            "the provider is overloaded" if overloaded else "the provider failed to answer",
            why=_waited(said, wait),
            fix="This is on the provider's side; retry in a moment.",
            retryable=True,
            kind="overloaded" if overloaded else "server",
            retry_after_s=wait,
        )
    return ProviderError(
        "the provider rejected the request",
        why=said,
        fix="Check the model name, max_tokens and the tools' schemas for this provider.",
        kind="request",
    )


def proxy_denied(host: str) -> ProviderError:
    return ProviderError(
        f"the network proxy refused the connection to {host}",
        why=f"{host} is not in policy.yaml network_whitelist",
        fix=f"Add {host} to network_whitelist in policy.yaml if this provider is intended.",
        kind="request",
    )


#: Failures below HTTP, first match wins: (types, what (with {host}), fix); all retryable.
TRANSPORT_FAILURES: tuple[tuple[tuple[type[httpx.HTTPError], ...], str, str], ...] = (
    (
        (httpx.ProxyError,),
        "the network proxy could not connect to {host}",
        "Check that the kernel's proxy is running and the host is reachable.",
    ),
    (
        (httpx.TimeoutException,),
        "the request to {host} timed out",
        "Retry; raise the provider's timeout if the model is slow.",
    ),
    (
        (httpx.ConnectError,),
        "cannot connect to {host}",
        "Check the provider's base_url and that the server is running.",
    ),
    (
        (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError),
        "the connection to {host} dropped",
        "Retry the request.",
    ),
)


def transport_error(exc: httpx.HTTPError, url: str, api_key: str) -> ProviderError:
    """A failure below HTTP (proxy, connect, timeout, dropped stream) as a ProviderError."""
    host = _host(url)
    detail = redact(f"{type(exc).__name__}: {exc}", api_key)[:MESSAGE_CHARS]
    if isinstance(exc, httpx.ProxyError) and str(exc).startswith("403"):
        return proxy_denied(host)
    for types, what, fix in TRANSPORT_FAILURES:
        if isinstance(exc, types):
            return ProviderError(
                what.format(host=host), why=detail, fix=fix, retryable=True, kind="network"
            )
    return ProviderError(
        f"the request to {host} failed",
        why=detail,
        fix="Check the provider's base_url and the network path to it.",
        kind="network",
    )


class Endpoint:
    """One provider URL with its headers: POST a JSON body, get JSON or SSE events back."""

    def __init__(
        self,
        client: httpx.Client,
        *,
        provider: str,
        url: str,
        headers: dict[str, str],
        api_key: str,
        timeout_s: float,
    ) -> None:
        self._client = client
        self.provider = provider
        self.url = url
        self._headers = {"content-type": "application/json", **headers}
        self._api_key = api_key
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 15.0))

    def __repr__(self) -> str:  # the headers hold the key: never shown
        return f"Endpoint(provider={self.provider!r}, url={safe_url(self.url)!r})"

    def post(self, body: dict[str, Any]) -> bytes:
        """The body of a successful answer (any failure: a ProviderError)."""
        try:
            response = self._client.post(
                self.url,
                content=msgspec.json.encode(body),
                headers=self._headers,
                timeout=self._timeout,
            )
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.url, self._api_key) from None
        if response.status_code >= 300:
            raise status_error(self.provider, response, self.url, self._api_key)
        return response.content

    def stream(self, body: dict[str, Any]) -> Generator[SSEEvent, None, None]:
        """The answer's SSE events; the response is closed when the iterator is."""
        try:
            with self._client.stream(
                "POST",
                self.url,
                content=msgspec.json.encode(body),
                headers=self._headers,
                timeout=self._timeout,
            ) as response:
                if response.status_code >= 300:
                    response.read()
                    raise status_error(self.provider, response, self.url, self._api_key)
                yield from iter_sse(iter_lines(response.iter_bytes()))
        except httpx.HTTPError as exc:
            raise transport_error(exc, self.url, self._api_key) from None

    def malformed(self, why: str) -> ProviderError:
        return ProviderError(
            f"the provider sent a malformed answer ({_host(self.url)})",
            why=why,
            fix="Check that base_url points at a server speaking this provider's API.",
            retryable=False,
            kind="malformed",
        )

    def decode(self, data: str | bytes, into: type[T]) -> T:
        """A JSON answer or stream event as ``into``, or a ProviderError (never a crash)."""
        try:
            return msgspec.json.decode(data, type=into)
        except msgspec.DecodeError as exc:
            text = data if isinstance(data, str) else data.decode("utf-8", "replace")
            shown = redact(text[:80], self._api_key)
            raise self.malformed(f"{exc} in {shown!r}") from None
