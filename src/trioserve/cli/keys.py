"""``trioserve keys``: ``new TENANT`` (a new API key and its key file line), ``check FILE``,
``new-webhook-secret`` (a ``whsec_`` secret for ``run --webhook-secret-file``)."""

from __future__ import annotations

import argparse
import base64
import secrets

from trioserve.cli._options import fail
from trioserve.http import ADMIN, KeyFileError, load_keys, new_key


def keys_main(args: argparse.Namespace) -> int:
    if args.keys_command == "check":
        return _check(args)
    if args.keys_command == "new-webhook-secret":  # 32 bytes: the Standard Webhooks range
        print("whsec_" + base64.b64encode(secrets.token_bytes(32)).decode())
        return 0
    # new: the key (line 1, for the client) and the key file's line (line 2, its SHA-256).
    key, line = new_key(args.tenant)  # a bad tenant name: ValueError, one line, exit 2
    print(key)
    print(f"{line} {ADMIN}" if args.admin else line)
    return 0


def _check(args: argparse.Namespace) -> int:
    """One line: what the file holds, or what is wrong with it (exit 2)."""
    try:
        ring = load_keys(args.file)
    except KeyFileError as exc:
        fail(str(exc))
    admins = sum(1 for entry in ring.entries if ADMIN in entry.scopes)
    tenants = len(ring.tenants)
    print(
        f"{args.file}: {len(ring.entries)} key{'s' if len(ring.entries) != 1 else ''} of"
        f" {tenants} tenant{'s' if tenants != 1 else ''}, {admins} with the admin scope"
    )
    return 0
