"""A session's inputs put into its spec's task: ``${inputs.<key>}`` references."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

#: ``${inputs.<key>}``; as in the reference, a key is any text (but braces, ``$``
#: and control characters).
_INPUT_REF: Final = re.compile(r"\$\{inputs\.([^${}\x00-\x1f]+)\}")


def missing_inputs(task: str, inputs: Mapping[str, str]) -> list[str]:
    """The keys ``${inputs.<key>}`` of ``task`` has no value for, sorted, each once."""
    return sorted({k for k in _INPUT_REF.findall(task) if k not in inputs})


def input_names(task: str) -> list[str]:
    """The keys of ``${inputs.<key>}`` in ``task``, each once, in order of first use."""
    return list(dict.fromkeys(_INPUT_REF.findall(task)))


def interpolate(task: str, inputs: Mapping[str, str]) -> str:
    """Replace ``${inputs.<key>}`` by the given values; one without a value stays as written."""
    return _INPUT_REF.sub(lambda m: inputs.get(m.group(1), m.group(0)), task)
