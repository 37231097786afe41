"""A FastAPI app that proxies trioserve turns to a browser as Server-Sent Events.

    pip install fastapi                # hypercorn comes with trioserve
    trioserve run examples/echo.yaml --in-memory &
    cd examples && TRIOSERVE_URL=http://127.0.0.1:8080 hypercorn fastapi_sse:app
    # then open http://127.0.0.1:8000/

``GET /`` is a page that asks and shows the reply as it streams;
``POST /sessions`` starts a trioserve session; ``GET
/sessions/{id}/turn?input=TEXT`` is the turn's events as an event stream
(what the page's ``EventSource`` reads), each ``data:`` the event's JSON
as trioserve sent it, and an ``error`` event carrying the error envelope
if trioserve refused the turn.

One ``Client`` serves the app for its life (``lifespan``).  A turn runs in
the task that streams its response: when the browser goes away, Starlette
cancels that task, the turn's block is left, and trioserve cancels the turn.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from trioserve.client import APIError, Client

TRIOSERVE_URL = os.environ.get("TRIOSERVE_URL", "http://127.0.0.1:8080")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with Client(TRIOSERVE_URL) as client:
        app.state.trioserve = client
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/sessions")
async def new_session(request: Request) -> dict[str, str]:
    session = await request.app.state.trioserve.create_session({"name": "browser"})
    return {"id": session.id}


@app.get("/sessions/{session_id}/turn")
async def turn(session_id: str, input: str, request: Request) -> StreamingResponse:
    client: Client = request.app.state.trioserve

    async def events() -> AsyncIterator[str]:
        try:
            async with client.turn(session_id, input) as stream:
                async for event in stream:
                    yield f"event: {event.type}\ndata: {event.raw}\n\n"
        except APIError as exc:  # refused (404, 409, 429, 503): say so, as trioserve would
            envelope = {"code": exc.code, "reason": exc.reason, "message": exc.message}
            yield f"event: error\ndata: {json.dumps({'error': envelope})}\n\n"

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


PAGE = """<!doctype html>
<meta charset="utf-8"><title>trioserve chat</title>
<form id="ask"><input id="text" autofocus placeholder="Say something"> <button>Send</button></form>
<pre id="reply"></pre>
<script>
let session = null;
document.getElementById("ask").onsubmit = async (submit) => {
  submit.preventDefault();
  session ??= (await (await fetch("/sessions", {method: "POST"})).json()).id;
  const text = document.getElementById("text").value, reply = document.getElementById("reply");
  const url = `/sessions/${session}/turn?input=${encodeURIComponent(text)}`;
  const events = new EventSource(url);
  events.addEventListener("message", (e) => {
    const data = JSON.parse(e.data).data;
    if (data.role === "assistant") reply.textContent += data.text;
  });
  events.addEventListener("session.ended", () => { reply.textContent += "\\n"; events.close(); });
  events.addEventListener("error", (e) => {
    if (e.data) reply.textContent += "\\n[" + JSON.parse(e.data).error.message + "]\\n";
    events.close();
  });
};
</script>
"""


@app.get("/", response_class=HTMLResponse)
async def page() -> str:
    return PAGE
