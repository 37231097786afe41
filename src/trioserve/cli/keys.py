"""``trioserve keys new TENANT``: a new API key, and its line for the ``--api-keys`` file."""

from __future__ import annotations

import argparse

from trioserve.http import new_key


def keys_main(args: argparse.Namespace) -> int:
    """Print the key (line 1, for the client) and the key file's line (line 2, its SHA-256)."""
    key, line = new_key(args.tenant)  # a bad tenant name: ValueError, one line, exit 2
    print(key)
    print(line)
    return 0
