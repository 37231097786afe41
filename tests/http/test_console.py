"""The web console's files over HTTP: served at / without a key, strict headers, ETags,
``--no-console``; ``GET /v1/agent``; the page's own Origin let through the guard.

What the page does in a browser is tests/system/test_console_browser.py's."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from tests.helpers import KEY_A, ServerFactory, auth, two_tenants
from tests.helpers.specs import compiled_spec, script
from trioserve.http._console import load_assets


async def test_the_page_and_its_files_are_served_with_strict_headers(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    page = await server.client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["script-src"] == "'self'"  # no inline script, no remote origin
    assert directives["default-src"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in csp and "http" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert page.headers["cache-control"] == "no-cache"
    # No inline script or style: every script and style sheet is a file of /console/.
    html = page.text
    assert "<script>" not in html and "<style" not in html and "onclick=" not in html
    linked = re.findall(r'(?:src|href)="(/console/[^"]+)"', html)
    assert {"/console/app.js", "/console/console.css"} <= set(linked)
    types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    for path in linked:
        resp = await server.client.get(path)
        assert resp.status_code == 200, path
        assert resp.headers["content-type"].startswith(types[path[path.rfind(".") :]])
        assert resp.headers["content-security-policy"] == csp
    # Each module the app imports is served too.
    app = (await server.client.get("/console/app.js")).text
    for module in re.findall(r'from "\./([\w.]+)"', app):
        assert (await server.client.get(f"/console/{module}")).status_code == 200, module


async def test_etag_answers_304_until_the_file_changes(start_server: ServerFactory) -> None:
    server = await start_server()
    first = await server.client.get("/console/app.js")
    etag = first.headers["etag"]
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag)
    again = await server.client.get("/console/app.js", headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["etag"] == etag
    other = await server.client.get("/console/app.js", headers={"If-None-Match": '"other"'})
    assert other.status_code == 200
    assert other.content == first.content


async def test_an_unknown_file_is_a_404_envelope(start_server: ServerFactory) -> None:
    server = await start_server()
    for path in ("/console/nope.js", "/console/", "/console/..%2fapp.js", "/index.html"):
        resp = await server.client.get(path)
        assert resp.status_code == 404, path
        assert resp.json()["error"]["reason"] == "route_not_found", path


async def test_no_console_serves_no_page(start_server: ServerFactory) -> None:
    server = await start_server(console=False)
    for path in ("/", "/console/app.js"):
        resp = await server.client.get(path)
        assert resp.status_code == 404, path
        assert resp.json()["error"]["reason"] == "route_not_found"
    document = (await server.client.get("/openapi.json")).json()
    assert "/" not in document["paths"] and "/v1/agent" in document["paths"]


async def test_with_keys_the_page_needs_none_and_its_data_calls_do(
    start_server: ServerFactory,
) -> None:
    server = await start_server(keys=two_tenants())
    assert (await server.client.get("/")).status_code == 200
    assert (await server.client.get("/console/api.js")).status_code == 200
    assert (await server.client.get("/v1/agent")).status_code == 401
    assert (await server.client.get("/v1/agent", headers=auth(KEY_A))).status_code == 200
    assert (await server.client.get("/v1/sessions")).status_code == 401


async def test_the_page_is_refused_to_a_host_not_allowed(start_server: ServerFactory) -> None:
    server = await start_server()
    resp = await server.client.get("/", headers={"Host": "evil.example"})
    assert resp.status_code == 421
    assert resp.json()["error"]["reason"] == "host_not_allowed"


async def test_the_agent_shows_public_fields_only(start_server: ServerFactory) -> None:
    spec = compiled_spec(task="Greet ${inputs.name} in ${inputs.lang}, then ${inputs.name} again.")
    spec["metadata"]["description"] = "A greeter."
    spec["runtime"]["options"] = {"token": "hunter2"}
    server = await start_server(spec=spec)
    resp = await server.client.get("/v1/agent")
    assert resp.status_code == 200
    assert resp.json() == {
        "name": "test-agent",
        "description": "A greeter.",
        "runtimeType": "exec",
        "model": {"provider": spec["model"]["provider"], "name": spec["model"]["name"]},
        "task": "Greet ${inputs.name} in ${inputs.lang}, then ${inputs.name} again.",
        "inputs": ["name", "lang"],
    }
    assert "hunter2" not in resp.text and "fakeadapter" not in resp.text


async def test_the_servers_own_origin_passes_the_guard(start_server: ServerFactory) -> None:
    """The console's POSTs carry its Origin: the server's own, not a listed one."""
    server = await start_server()
    host = urlsplit(server.url).netloc
    own = await server.client.post("/v1/sessions", headers={"Origin": f"http://{host}"})
    assert own.status_code == 201, own.text
    assert "access-control-allow-origin" not in own.headers
    port = int(host.rsplit(":", 1)[1])
    for origin in (
        "http://evil.example",
        f"http://127.0.0.1:{port + 1}",
        f"http://localhost:{port}",  # another origin, though the same server
        "null",
    ):
        resp = await server.client.post("/v1/sessions", headers={"Origin": origin})
        assert resp.status_code == 403, origin
        assert resp.json()["error"]["reason"] == "origin_not_allowed"


def test_the_package_holds_the_console() -> None:
    """What the wheel ships (package data): the page and every file it names."""
    assets = load_assets()
    html = assets["index.html"].body.decode()
    for name in re.findall(r'"/console/([^"]+)"', html):
        assert name in assets, name
    assert {"app.js", "api.js", "sse.js", "turns.js", "console.css"} <= set(assets)


async def test_readyz_counts_the_turns_running_against_the_cap(
    start_server: ServerFactory,
) -> None:
    """What the console's server panel shows."""
    server = await start_server(max_concurrent_turns=3)
    ready = {"Accept": "application/json"}
    assert (await server.client.get("/readyz", headers=ready)).json()["turns"] == {
        "running": 0,
        "max": 3,
    }
    session = (await server.create())["id"]
    body = {"input": script({"hang": True}), "detach": True}
    started = await server.client.post(f"/v1/sessions/{session}/turns", json=body)
    assert started.status_code == 202, started.text
    turns = (await server.client.get("/readyz", headers=ready)).json()["turns"]
    assert turns == {"running": 1, "max": 3}
    cancelled = await server.client.delete(f"/v1/sessions/{session}/turns/current")
    assert cancelled.status_code == 202
