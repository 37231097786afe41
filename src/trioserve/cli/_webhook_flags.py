"""``trioserve run``'s webhook flags, and the ``WebhookSettings`` they make.

The defaults are ``WebhookSettings``'; the secret is read from its file at
start (never from the command line, where ``ps`` would show it), and a
bad one is one line on stderr.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlsplit

from trioserve.cli._options import DURATION, POSITIVE_DURATION, Extend, Value, defaults, fail
from trioserve.sessions import WebhookSettings


def _allow(text: str) -> tuple[str, ...]:
    entries = tuple(entry.strip() for entry in text.split(",") if entry.strip())
    if not entries:
        raise ValueError("expected HOST[,HOST...]: a host name, an IP address, *.DOMAIN or *")
    for entry in entries:
        if "/" in entry or " " in entry:
            raise ValueError(f"{entry!r}: expected a host name, an IP address, *.DOMAIN or *")
    return entries


def _url(text: str) -> str:
    try:
        url = urlsplit(text)
        host = url.hostname
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    if url.scheme not in ("http", "https") or not host:
        raise ValueError(f"{text!r}: expected an http:// or https:// URL")
    return text


ALLOW = Value(_allow, "hosts", ",".join)
URL = Value(_url, "url")


def add_webhook_flags(run: argparse.ArgumentParser) -> None:
    """The ``--webhook*`` flags (docs/operations.md, "Webhooks")."""
    hooks = defaults(WebhookSettings)
    run.add_argument(
        "--webhook",
        dest="webhook_url",
        type=URL,
        default=hooks["url"],
        metavar="URL",
        help="POST every turn's end (its record, signed) to URL, at least once, kept in the"
        " store until a 2xx; needs --webhook-secret-file (default: off, only the turns that"
        " name their own webhook)",
    )
    run.add_argument(
        "--webhook-secret-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the whsec_ secret that signs webhooks (Standard Webhooks); make one with"
        " 'trioserve keys new-webhook-secret' (default: off, no webhooks; a turn's webhook"
        " is a 400)",
    )
    run.add_argument(
        "--webhook-allow",
        type=ALLOW,
        action=Extend,
        default=hooks["allow"],
        metavar="HOST[,HOST...]",
        help="the hosts a turn's own webhook URL may name: a host or IP address (private,"
        " loopback and link-local ones only so), *.DOMAIN or *; repeatable (default: no host,"
        " a turn's own webhook is refused)",
    )
    run.add_argument(
        "--webhook-retry-for",
        type=DURATION,
        default=hooks["retry_for"],
        metavar="D",
        help="how long a webhook is retried after its first attempt (exponential backoff with"
        " jitter), then given up",
    )
    run.add_argument(
        "--webhook-backoff",
        type=POSITIVE_DURATION,
        default=hooks["backoff"],
        metavar="D",
        help="the first retry's delay, doubled at each retry up to an hour, with jitter",
    )
    run.add_argument(
        "--webhook-timeout",
        type=POSITIVE_DURATION,
        default=hooks["timeout"],
        metavar="D",
        help="a webhook attempt's deadline, connection to answer (connecting: at most"
        f" {hooks['connect_timeout']:g}s of it)",
    )


def webhook_settings(args: argparse.Namespace) -> WebhookSettings:
    """The settings the flags give; a bad secret file or a lone flag is one line, exit 2."""
    from trioserve.sessions import check_secret

    secret = None
    if args.webhook_secret_file is not None:
        path: Path = args.webhook_secret_file
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"--webhook-secret-file {path}: cannot read it: {exc}")
        try:
            secret = check_secret(text)
        except ValueError as exc:
            fail(
                f"--webhook-secret-file {path}: {exc} (make one: trioserve keys new-webhook-secret)"
            )
    elif args.webhook_url is not None or args.webhook_allow:
        fail("--webhook and --webhook-allow need --webhook-secret-file (the signing secret)")
    timeout = args.webhook_timeout
    return WebhookSettings(
        url=args.webhook_url,
        secret=secret,
        allow=tuple(args.webhook_allow),
        retry_for=args.webhook_retry_for,
        backoff=args.webhook_backoff,
        timeout=timeout,
        connect_timeout=min(defaults(WebhookSettings)["connect_timeout"], timeout),
    )
