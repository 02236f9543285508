"""`ServerClient`: JSON over HTTP to an OpenAI-compatible server, with timeouts and retries.

Retry policy (one place, so every request follows it):
1. A connection error (refused, reset, DNS), a connect timeout, or an answer of HTTP 429 or 5xx is
   retried up to `retries` times, waiting backoff * 2**k seconds before retry k (capped at
   `MAX_WAIT_S`; a 429/503 `Retry-After` header of at most that many seconds is honoured instead).
2. A read timeout (the server accepted the request and did not answer within `timeout` seconds) is
   not retried: a stuck or overloaded server would only multiply the wait. It fails at once.
3. Any other HTTP error (400, 401, 404, 422, ...) is the caller's and is not retried.
What finally fails raises `ServerError` naming the URL, what failed and what to check (a 400 that
says the prompt is too long raises `ServerContextError`). The client is thread-safe (one
`httpx.Client`, a pool of `max_connections` connections) so a thread pool can share it. Its `clock`
times every attempt's round trip (`treesearch.backends.request_clock`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from treesearch.backends.request_clock import RequestClock
from treesearch.common.errors import ServerContextError, ServerError

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'treesearch[server]'  (or: pip install httpx)"
MAX_WAIT_S = 10.0  # longest wait between two attempts
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


def _httpx() -> Any:
    try:
        import httpx
    except ImportError:
        raise ImportError(
            f"the server backend needs the httpx package; install it with:\n    {INSTALL_HINT}"
        ) from None
    return httpx


def root_url(base_url: str) -> str:
    """The server's root URL: "http://h:8000/v1/" -> "http://h:8000" (endpoints are added to it)."""
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url={base_url!r}; write the server's URL, e.g. http://127.0.0.1:8000/v1")
    return url[:-3] if url.endswith("/v1") else url


class ServerClient:
    """POST / GET JSON to one server. `api_key` goes in an `Authorization: Bearer` header."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_connections: int = 8,
    ) -> None:
        httpx = _httpx()
        self.root = root_url(base_url)
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.clock = RequestClock()  # times every round trip (treesearch.backends.request_clock)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.timeout),
            headers=headers,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    def close(self) -> None:
        self._client.close()

    def post(self, path: str, body: dict, *, allow: tuple[int, ...] = ()) -> tuple[int, Any]:
        """(status, JSON answer) of POST path; statuses in `allow` are returned instead of raised."""
        return self._request("POST", path, body, allow)

    def get(self, path: str, *, allow: tuple[int, ...] = ()) -> tuple[int, Any]:
        return self._request("GET", path, None, allow)

    # -- one request with the retry policy -------------------------------------------------------
    def _request(self, method: str, path: str, body: dict | None, allow: tuple[int, ...]) -> tuple[int, Any]:
        httpx = _httpx()
        url = self.root + path
        last = ""
        for attempt in range(self.retries + 1):
            wait = min(self.backoff * 2**attempt, MAX_WAIT_S)
            try:
                with self.clock.round_trip():
                    resp = self._client.request(method, url, json=body)
            except httpx.ReadTimeout:
                raise ServerError(
                    f"{method} {url}: no answer within {self.timeout:g} s (read timeout); the server "
                    "is stuck or overloaded: check it, or raise the timeout (ServerEngine(timeout=...), "
                    "--server-timeout)",
                    url=url,
                ) from None
            except (
                httpx.ConnectError,
                httpx.ConnectTimeout,
                httpx.RemoteProtocolError,
                httpx.ReadError,
                httpx.WriteError,
                httpx.WriteTimeout,
                httpx.PoolTimeout,
            ) as err:
                last = f"{type(err).__name__}: {err or 'connection failed'}"
            else:
                if resp.status_code < 400 or resp.status_code in allow:
                    return resp.status_code, _json(resp, method, url)
                if resp.status_code not in RETRY_STATUS:
                    raise _refused(method, url, resp)
                last = f"HTTP {resp.status_code}: {_excerpt(resp.text)}"
                wait = _retry_after(resp, wait)
            if attempt < self.retries:
                log.warning(
                    "%s %s failed (%s); retry %d of %d in %.2f s",
                    method,
                    url,
                    last,
                    attempt + 1,
                    self.retries,
                    wait,
                )
                time.sleep(wait)
        status = int(last[5:8]) if last.startswith("HTTP ") else None
        hint = (
            "the server is failing: check its log"
            if status
            else f"is a server running at {self.root}? Start one (docs/guide/servers.md) or fix the base URL"
        )
        raise ServerError(
            f"{method} {url} failed after {self.retries + 1} attempts ({last}); {hint}",
            url=url,
            status=status,
        )


def _json(resp: Any, method: str, url: str) -> Any:
    try:
        return resp.json()
    except ValueError:
        raise ServerError(
            f"{method} {url}: the answer is not JSON ({_excerpt(resp.text)}); is base_url an "
            "OpenAI-compatible server?",
            url=url,
            status=resp.status_code,
        ) from None


def _refused(method: str, url: str, resp: Any) -> ServerError:
    """The error for an answer that retrying cannot fix, with the server's own message."""
    code, text = resp.status_code, _excerpt(_message(resp))
    if code in (401, 403):
        fix = "set the API key in the TREESEARCH_API_KEY (or OPENAI_API_KEY) environment variable"
    elif code == 404:
        fix = "base_url should be the server's root (http://host:port) or its /v1 URL"
    elif code in (400, 422) and "context" in text.lower():
        return ServerContextError(
            f"{method} {url}: HTTP {code}: {text}; the prompt does not fit the server model's "
            "context: give ServerEngine(max_context=...) (--server-max-context) so that the "
            "search prunes branches that do not fit",
            url=url,
            status=code,
        )
    else:
        fix = "the server refused the request as sent; check the model name and the server's log"
    return ServerError(f"{method} {url}: HTTP {code}: {text}; {fix}", url=url, status=code)


def _message(resp: Any) -> str:
    try:
        data = resp.json()
    except ValueError:
        return resp.text
    if isinstance(data, dict):
        err = data.get("error", data.get("detail", data.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return str(err)
    return str(data)


def _retry_after(resp: Any, wait: float) -> float:
    try:
        value = float(resp.headers.get("retry-after", ""))
    except ValueError:
        return wait
    return value if 0 <= value <= MAX_WAIT_S else wait


def _excerpt(text: str, n: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."
