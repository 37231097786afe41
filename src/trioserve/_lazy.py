"""Package surfaces that load on first use (PEP 562 ``__getattr__``).

A package's ``__init__`` lists what it exports and the private module each
name lives in; importing the package loads none of them.  So a program run
as ``python -m trioserve.runtime.reaper`` (which imports its package first)
starts without trio, and ``from trioserve.http import KeyRing`` loads the
key module, not the app.  Type checkers read the same names from the
``__init__``'s ``TYPE_CHECKING`` imports (``tests/test_surfaces.py`` checks
that the two lists agree).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str,
    names: Mapping[str, tuple[str, ...]],
    modules: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    ``names`` maps each private module (relative to the package) to the
    names it exports; ``modules`` maps an exported name to a private module
    exported whole.  A name is imported the first time it is asked for,
    then kept in the package.
    """
    where: dict[str, tuple[str, str | None]] = {
        name: (module, name) for module, exported in names.items() for name in exported
    }
    where |= {alias: (module, None) for alias, module in (modules or {}).items()}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = where[name]
        value = importlib.import_module(f"{package}.{module}")
        if attribute is not None:
            value = getattr(value, attribute)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
