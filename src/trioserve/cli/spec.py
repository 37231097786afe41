"""``trioserve validate`` and ``trioserve compile``: a spec checked, or compiled and printed.

A problem raises ``SpecError``, which ``trioserve.cli.main`` prints as a
list (exit 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trioserve.spec import (
    AgentDocument,
    CompiledSpec,
    check_agent,
    compile_agent,
    load_agent,
    load_document,
)


def validate_main(args: argparse.Namespace) -> int:
    """``trioserve validate SPEC [--registry DIR]``."""
    doc = load_document(args.spec)
    unresolved = []
    if isinstance(doc, AgentDocument):
        unresolved = check_agent(doc, registry_dir=args.registry)
    print(f"{args.spec}: valid {doc.kind} {doc.metadata.name!r}")
    if unresolved:
        count = len(unresolved)
        print(
            f"{args.spec}: {count} registry reference{'s' if count != 1 else ''} not resolved"
            " (give --registry DIR to check them as compile and run do)"
        )
    return 0


def compile_spec(spec_path: Path, registry: Path | None) -> CompiledSpec:
    """The Agent spec at ``spec_path`` compiled (registry: the working directory by default)."""
    return compile_agent(load_agent(spec_path), registry_dir=registry or Path.cwd())


def compile_main(args: argparse.Namespace) -> int:
    """``trioserve compile SPEC [--registry DIR]``: the CompiledSpec's wire form, indented."""
    print(json.dumps(compile_spec(args.spec, args.registry).to_json_dict(), indent=2))
    return 0
