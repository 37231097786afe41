"""``GET /openapi.json``: the document validates, matches the server and docs/api.md,
and schemathesis finds no response of a live server that breaks it."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate

from tests.helpers import ROOT, STARTUP_URL, ServerFactory, cli_env, write_spec
from trioserve import errors
from trioserve.http import _openapi as openapi
from trioserve.http._app import create_app
from trioserve.http._auth import parse_keys
from trioserve.http._errors import STATUS_OF, status_for
from trioserve.http._openapi_components import REASONS

API_MD = ROOT / "docs" / "api.md"


@pytest.mark.parametrize("auth", [False, True])
def test_document_validates(auth: bool) -> None:
    document = openapi.build(auth=auth)
    validate(document)  # raises on any violation of OpenAPI 3.1
    assert document["openapi"] == "3.1.0"
    run_turn = document["paths"]["/v1/sessions/{sessionId}/turns"]["post"]
    assert ("401" in run_turn["responses"]) is auth
    assert ("security" in document) is auth


def test_reasons_match_the_errors_and_api_md() -> None:
    # Every error the code raises has its reason in the document, at its status.
    for cls in _subclasses(errors.TrioserveError):
        if cls.reason == "invalid_spec" or not any(c in STATUS_OF for c in cls.__mro__):
            continue
        exc = cls("x", earliest_seq=1) if cls is errors.CursorExpired else cls("x")
        assert REASONS[cls.reason][0] == status_for(exc), cls
    # docs/api.md's table of errors lists the same reasons with the same statuses.
    rows = re.findall(r"^\| (\d{3}) \| `([a-z_]+)` \|", API_MD.read_text(), re.MULTILINE)
    assert {reason: int(status) for status, reason in rows} == {
        reason: status for reason, (status, _) in REASONS.items()
    }


def _subclasses(cls: type[errors.TrioserveError]) -> Iterator[type[errors.TrioserveError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


async def test_served_public_and_covers_every_route(start_server: ServerFactory) -> None:
    ring = parse_keys("sha256:" + "0" * 64 + " acme\n", "keys")
    server = await start_server(keys=ring, allowed_hosts=("localhost",))
    # No key, and a Host the guarded routes refuse: the document is public.
    resp = await server.client.get("/openapi.json", headers={"Host": "elsewhere.example"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    document = resp.json()
    assert document == openapi.build(auth=True)
    refused = await server.client.get("/v1/sessions", headers={"Host": "elsewhere.example"})
    assert refused.status_code == 421
    # Every route the app serves is a path of the document, with its methods.
    app = create_app(server.manager)
    served = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(\w+)>", lambda m: "{" + _camel(m.group(1)) + "}", rule.rule)
        methods = {"get"} if rule.websocket else {m.lower() for m in rule.methods or ()}
        served |= {(path, m) for m in methods - {"head", "options"}}
    paths = document["paths"].items()
    documented = {(p, m) for p, item in paths for m in item if m != "parameters"}
    assert served == documented


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


# --- schemathesis against a live server ---------------------------------------------------


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``trioserve run`` (echo runtime) as a subprocess, for the sync schemathesis run."""
    tmp_path = tmp_path_factory.mktemp("schemathesis")
    spec = write_spec(tmp_path, runtime="echo")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trioserve", "run", str(spec), "--port", "0"],
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=cli_env(tmp_path),
        cwd=tmp_path,
        text=True,
    )
    assert proc.stderr is not None
    log = ""
    for line in proc.stderr:
        log += line
        if match := STARTUP_URL.search(line):
            break
    else:
        raise AssertionError(f"server did not start:\n{log}")
    try:
        yield match.group(1)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


# Five examples per operation and mode: over a minute on a loaded 2-core machine.
@pytest.mark.timeout(240)
def test_schemathesis_finds_nothing(live_url: str) -> None:
    """schemathesis, every operation, valid and invalid input: no response breaks the document.

    Each operation gets its own bounded run: 5 examples (derandomized, no
    deadline: the server is a real process) with valid input, 5 with invalid
    input, and 5 more against a session that exists.  One run per
    strategy, rather than 200 examples drawn from all of them at once, makes
    sure every operation is called, and it is quick: drawing from a mix
    spent most of its time on the mix's invalid-input strategies that have
    nothing to make invalid (an operation without parameters), which
    Hypothesis cannot satisfy; alone, such a strategy says so at once
    (``Unsatisfiable``), which is allowed for invalid input only.
    """
    import schemathesis
    from hypothesis.errors import Unsatisfiable
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
        content_type_conformance,
    ]
    schema = schemathesis.openapi.from_url(f"{live_url}/openapi.json")
    # An Err (an operation schemathesis cannot read) has no ok(): the test fails on it.
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    # Every operation but GET /openapi.json, which schemathesis leaves out when loaded from it
    # (the console's and the faces' included: /mcp's three, /ag-ui, /a2a and its card).
    assert len(operations) == 30, [op.label for op in operations]
    session = httpx.post(f"{live_url}/v1/sessions").json()["id"]
    calls: Counter[tuple[str, str]] = Counter()

    def play(label: str, kind: str, strategy: st.SearchStrategy[Any]) -> None:
        @settings(
            max_examples=5,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=strategy)
        def run(case: Any) -> None:
            calls[label, kind] += 1
            case.call_and_validate(base_url=live_url, checks=checks, timeout=60)

        run()

    for operation in operations:
        play(operation.label, "valid", operation.as_strategy())
        # Unsatisfiable: nothing in it can be wrong (say, a path parameter of any text).
        with contextlib.suppress(Unsatisfiable):
            invalid = operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE)
            play(operation.label, "invalid", invalid)
        if "sessionId" in operation.path:
            # The same with a session that exists: streams, 202s and 409s.
            known = operation.as_strategy(path_parameters={"sessionId": session})
            play(operation.label, "known session", known)
    assert {label for label, kind in calls if kind == "valid"} == {op.label for op in operations}
    # Those with a query or a body had invalid ones (the others have nothing to get wrong).
    assert {label for label, kind in calls if kind == "invalid"} >= {
        "POST /v1/sessions",
        "GET /v1/sessions",
        "GET /v1/sessions/{sessionId}/events",
        "POST /v1/sessions/{sessionId}/turns",
    }, calls
    assert sum(calls.values()) >= 90, calls
