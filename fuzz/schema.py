"""schemathesis over the server's OpenAPI document, for a bounded time.

Operation after operation (valid input, input that breaks the schema, and
for the routes of a session one that exists), a few random examples each,
round after round until the time is up.  ``not_a_server_error`` is the
check: a ``5xx`` (but ``501``) is a finding.  A conformance check is
``tests/http/test_openapi.py``'s business.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from fuzz import Findings

_EXAMPLES = 10


def run(url: str, session_id: str, seconds: float, seed: int, findings: Findings) -> None:
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as reproducible_with
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    deadline = time.monotonic() + seconds
    round_ = 0
    reproducible = reproducible_with(seed)

    def play(label: str, strategy: st.SearchStrategy[Any]) -> None:
        @settings(
            max_examples=_EXAMPLES,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def one(case: Any) -> None:
            if time.monotonic() > deadline:
                return
            findings.count("schemathesis")
            try:
                response = case.call(base_url=url, timeout=30)
            except Exception as exc:  # a transport error: the server hung up or hangs
                findings.add("schemathesis transport", operation=label, detail=repr(exc))
                return
            if response.status_code >= 500 and response.status_code != 501:
                findings.add(
                    "5xx",
                    operation=label,
                    request=case.as_curl_command(),
                    answer=f"{response.status_code} {response.text[:1000]}",
                )

        with contextlib.suppress(Unsatisfiable):  # nothing in it can be made invalid
            reproducible(one)()

    while time.monotonic() < deadline:
        round_ += 1
        for operation in operations:
            if time.monotonic() > deadline:
                break
            play(operation.label, operation.as_strategy())
            negative = schemathesis.GenerationMode.NEGATIVE
            play(operation.label, operation.as_strategy(generation_mode=negative))
            if "sessionId" in operation.path:
                known = operation.as_strategy(path_parameters={"sessionId": session_id})
                play(operation.label, known)
    findings.count("schemathesis rounds", round_)
