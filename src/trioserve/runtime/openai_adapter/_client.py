"""One streamed Chat Completions request over httpx.

Why httpx and not the ``openai`` SDK: httpx is already one of trioserve's
dependencies and imports in about a fifth of the SDK's time (0.12 s against
0.65 s here), which every cold turn pays; the request is one ``POST`` whose
stream the adapter must read chunk by chunk anyway (each text piece is an
event); and the adapter must turn every failure into its own event, so the
SDK's retries (which would hide a 429) and exception classes would be
undone rather than used.  See ``_stream.py`` for the wire.
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import httpx

from trioserve.runtime.openai_adapter._errors import for_status
from trioserve.runtime.openai_adapter._events import Failure
from trioserve.runtime.openai_adapter._settings import CONNECT_TIMEOUT, Settings
from trioserve.runtime.openai_adapter._stream import EventLines, Reply, ReplyBuilder

#: The most of an error body read (its message is quoted, cut shorter).
_ERROR_BODY_LIMIT: Final = 64 * 1024


@dataclass
class Timing:
    """How long a request took: to its first chunk, and whole."""

    first_chunk_ms: float | None
    duration_ms: float


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """The TLS context of this process's clients, made once (loading the CA bundle costs
    ~20 ms of CPU): a forked adapter inherits the fork server's (``_adapter.warm_up``)."""
    return httpx.create_ssl_context(verify=True, trust_env=True)


class ModelClient:
    """Streams replies from ``{base_url}/chat/completions``."""

    def __init__(self, settings: Settings, model: str) -> None:
        self.settings = settings
        self.model = model
        headers = {"Accept": "text/event-stream"}
        if settings.api_key:
            headers["Authorization"] = f"Bearer {settings.api_key}"
        timeout = httpx.Timeout(
            settings.request_timeout, connect=min(CONNECT_TIMEOUT, settings.request_timeout)
        )
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout, verify=ssl_context())

    async def aclose(self) -> None:
        await self._http.aclose()

    @staticmethod
    async def warm_up() -> None:
        """Make and close a client: what the first one loads is loaded (``_adapter.warm_up``)."""
        async with httpx.AsyncClient(verify=ssl_context()):
            pass

    async def stream(
        self, body: dict[str, Any], on_text: Callable[[str], None]
    ) -> tuple[Reply, Timing]:
        """POST ``body`` with ``stream: true``; ``on_text`` gets each text piece as it comes."""
        url = self.settings.shown_url
        started = time.monotonic()
        first: float | None = None
        builder = ReplyBuilder()
        try:
            async with self._http.stream(
                "POST", f"{self.settings.base_url}/chat/completions", json=body
            ) as response:
                if response.status_code != 200:
                    said = await _read_some(response)
                    raise for_status(
                        response.status_code,
                        said,
                        dict(response.headers),
                        model=self.model,
                        url=url,
                    )
                kind = response.headers.get("content-type", "")
                if "text/event-stream" not in kind:
                    raise Failure(
                        "model_stream_malformed",
                        f"the model server at {url} answered {kind or 'no content type'}, not"
                        " an event stream; is it an OpenAI-compatible /v1 endpoint?",
                    )
                lines = EventLines()
                async for line in response.aiter_lines():
                    data = lines.feed(line)
                    if data is None:
                        continue
                    if first is None:
                        first = time.monotonic()
                    text = builder.add_data(data)
                    if text:
                        on_text(text)
                    if builder.done:
                        break
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
                raise _unreachable(url, "the connection timed out") from None
            raise Failure(
                "model_timeout",
                f"the model server at {url} sent nothing for {self.settings.request_timeout:g} s;"
                " raise runtime.options.requestTimeoutMs for a slow model",
            ) from None
        except httpx.ConnectError as exc:
            raise _unreachable(url, str(exc) or type(exc).__name__) from None
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise Failure(
                "model_connection_lost",
                f"the connection to the model server at {url} broke before the reply ended"
                f" ({exc or type(exc).__name__}); try again",
            ) from None
        except httpx.HTTPError as exc:
            raise _unreachable(url, f"{type(exc).__name__}: {exc}") from None
        ended = time.monotonic()
        timing = Timing(
            None if first is None else round((first - started) * 1000, 1),
            round((ended - started) * 1000, 1),
        )
        return builder.reply(), timing


def _unreachable(url: str, why: str) -> Failure:
    return Failure(
        "model_unreachable",
        f"cannot reach the model server at {url} ({why}); is it running? Set its address"
        " in TRIOSERVE_OPENAI_BASE_URL or OPENAI_BASE_URL where trioserve runs",
    )


async def _read_some(response: httpx.Response) -> bytes:
    body = b""
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= _ERROR_BODY_LIMIT:
            break
    return body[:_ERROR_BODY_LIMIT]
