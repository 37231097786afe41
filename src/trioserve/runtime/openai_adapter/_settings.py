"""The adapter's settings: the model server's address and key, and the spec's options.

The address and the key come from the environment only, never from the
spec (so neither is stored with a session nor logged): the trioserve
variables first, then the OpenAI SDK's own.

=============================  =============================================
``TRIOSERVE_OPENAI_BASE_URL``  else ``OPENAI_BASE_URL``, else
                               ``https://api.openai.com/v1``
``TRIOSERVE_OPENAI_API_KEY``   else ``OPENAI_API_KEY``; none: no
                               ``Authorization`` header (a local server)
=============================  =============================================

``runtime.options`` (checked by the compiler, ``OPENAI_OPTIONS``) override
the defaults of :class:`Settings`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit, urlunsplit

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
BASE_URL_ENV: Final = ("TRIOSERVE_OPENAI_BASE_URL", "OPENAI_BASE_URL")
API_KEY_ENV: Final = ("TRIOSERVE_OPENAI_API_KEY", "OPENAI_API_KEY")
CONNECT_TIMEOUT: Final = 10.0


@dataclass(frozen=True)
class Settings:
    """Where the model is and how a turn may use it."""

    base_url: str = DEFAULT_BASE_URL
    api_key: str | None = None
    #: The context window to stay within, in estimated tokens (4 characters each).
    context_tokens: int = 8192
    #: ``max_tokens`` of each request (None: the server's default).
    max_tokens: int | None = None
    #: Model rounds that may end in tool calls, per turn.
    max_tool_rounds: int = 8
    tool_timeout: float = 60.0
    #: The longest the model server may stay silent: before its answer, between chunks.
    request_timeout: float = 300.0
    #: For every MCP server to start, initialize and list its tools.
    mcp_start_timeout: float = 30.0

    @property
    def reply_reserve(self) -> int:
        """Tokens kept free for the reply when the history is cut to the budget."""
        return self.max_tokens or 1024

    @property
    def shown_url(self) -> str:
        """The base URL as messages show it: no user, password, query or fragment."""
        parts = urlsplit(self.base_url)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _env(names: tuple[str, ...], environ: Mapping[str, str]) -> str | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


def settings_from(
    options: Mapping[str, object], environ: Mapping[str, str] | None = None
) -> Settings:
    """The settings of a turn: ``options`` are the spec's ``runtime.options``."""
    env = os.environ if environ is None else environ

    def number(name: str, default: float, scale: float = 1.0) -> float:
        value = options.get(name)
        return float(value) / scale if isinstance(value, int | float) else default

    max_tokens = options.get("maxTokens")
    return Settings(
        base_url=(_env(BASE_URL_ENV, env) or DEFAULT_BASE_URL).rstrip("/"),
        api_key=_env(API_KEY_ENV, env),
        context_tokens=int(number("contextTokens", Settings.context_tokens)),
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        max_tool_rounds=int(number("maxToolRounds", Settings.max_tool_rounds)),
        tool_timeout=number("toolTimeoutMs", Settings.tool_timeout, 1000),
        request_timeout=number("requestTimeoutMs", Settings.request_timeout, 1000),
        mcp_start_timeout=number("mcpStartTimeoutMs", Settings.mcp_start_timeout, 1000),
    )
