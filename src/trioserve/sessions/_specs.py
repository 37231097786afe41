"""The typed spec of each recent session, so that a turn does not validate its stored JSON again.

A session's spec is fixed when it is created and stored as JSON (stores
keep plain data and import nothing of ``spec``).  A turn needs it typed:
``SessionSpecs.of`` gives the CompiledSpec this process built at create
time, or validates the stored JSON once (a session created by an earlier
process, or by another worker) and keeps it.  At most ``size`` sessions
are kept, the oldest dropped first; a dropped one is validated again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from trioserve.spec import CompiledSpec
from trioserve.stores.base import Session

#: Sessions whose typed spec is kept (each a shallow copy of the served spec).
DEFAULT_SIZE: Final = 4096


class SessionSpecs:
    """A bounded map from session id to its typed spec; see the module doc."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self._size = size
        self._specs: OrderedDict[str, CompiledSpec] = OrderedDict()

    def add(self, session_id: str, spec: CompiledSpec) -> None:
        """Keep ``spec`` as the session's (a session's spec never changes)."""
        self._specs[session_id] = spec
        self._specs.move_to_end(session_id)
        while len(self._specs) > self._size:
            self._specs.popitem(last=False)

    def of(self, session: Session) -> CompiledSpec:
        """The session's spec, typed; ``SpecError`` if its stored JSON is not a CompiledSpec."""
        spec = self._specs.get(session.id)
        if spec is None:
            spec = CompiledSpec.from_json_dict(session.spec)
            self.add(session.id, spec)
        return spec
