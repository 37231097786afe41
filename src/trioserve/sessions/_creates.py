"""Creating a session: its inputs checked, its spec's task filled in, its caps taken.

``SessionCreates`` is a base of ``SessionManager`` (``_manager.py``); a
create under an idempotency key comes through ``_idempotency`` with its
claim.  The session's typed spec is kept in ``SessionSpecs`` (the store
keeps its JSON).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from trioserve.errors import Draining, InvalidRequest
from trioserve.protocol import SessionStatus
from trioserve.sessions._admission import Admission
from trioserve.sessions._ids import new_session_id
from trioserve.sessions._inputs import interpolate, missing_inputs
from trioserve.sessions._limits import Limits
from trioserve.sessions._specs import SessionSpecs
from trioserve.spec import CompiledSpec
from trioserve.stores.base import Session, Store, utcnow
from trioserve.stores.records import IdempotencyClaim

log = logging.getLogger("trioserve.manager")


class SessionCreates:
    """Session creates for ``SessionManager``, which sets these attributes."""

    store: Store
    spec: CompiledSpec
    limits: Limits
    draining: bool
    _admission: Admission
    _specs: SessionSpecs

    def _shared_cap(self, limit: int) -> int | None:
        raise NotImplementedError  # SessionManager's

    async def create_session(
        self, inputs: Mapping[str, str] | None = None, *, tenant: str | None = None
    ) -> Session:
        """A new active session of ``tenant``; refused over the global or the tenant's cap."""
        return await self._create_session(inputs, tenant, None)

    async def _create_session(
        self,
        inputs: Mapping[str, str] | None,
        tenant: str | None,
        claim: IdempotencyClaim | None,
    ) -> Session:
        if self.draining:
            raise Draining("server is draining; not accepting new sessions")
        inputs = dict(inputs or {})
        missing = missing_inputs(self.spec.task, inputs)
        if missing and self.limits.require_inputs:
            keys = ", ".join(missing)
            raise InvalidRequest(f"missing inputs referenced by the spec's task: {keys}")
        spec = self.spec.with_task(interpolate(self.spec.task, inputs))
        session_id = new_session_id()
        self._admission.take_session(session_id, tenant)
        now = utcnow()
        session = Session(
            id=session_id,
            agent_name=spec.metadata.name,
            runtime_type=spec.runtime.type,
            status=SessionStatus.ACTIVE,
            created_at=now,
            last_active_at=now,
            spec=spec.to_json_dict(),  # stores keep JSON; SessionSpecs keeps it typed
            inputs=inputs,
            tenant=tenant,
        )
        try:
            await self.store.create(
                session,
                max_active=self._shared_cap(self.limits.max_sessions),
                max_active_per_tenant=self._shared_cap(self.limits.max_sessions_per_tenant),
                idempotency=claim,
            )
        except BaseException:
            self._admission.release_session(session_id)
            raise
        self._specs.add(session_id, spec)
        if missing:
            log.warning(
                "session %s: no value for inputs referenced by the spec's task: %s"
                " (left as written)",
                session_id,
                ", ".join(missing),
            )
        return session
