"""Bounded telemetry: no client can grow the metrics registry.

Every label is from a closed set (``observe._metrics``): hostile requests
of every kind -- methods of any spelling, paths and queries of any text,
malformed hosts, bodies that are not JSON -- add no series once each kind
has been seen once.
"""

from __future__ import annotations

import random
import string

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import GUARD, Raw, ServerFactory, parse_reply
from trioserve.observe._metrics import METHODS, Metrics
from trioserve.stores.base import TurnEnd, utcnow
from trioserve.stores.records import TurnStatus

#: Requests sent before counting (every kind, several times), then after.
WARM_UP, HOSTILE = 500, 2_000
_TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
_PATH = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@%/"


def series(text: str) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    """Every sample of the exposition, by name and labels (their values left out)."""
    return {
        (sample.name, frozenset(sample.labels.items()))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


class Hostile:
    """Requests of fixed kinds with random content: one (method, route, status) per
    kind, or refused below the application (never counted)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def text(self, alphabet: str, low: int, high: int) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(self.rng.randint(low, high)))

    def pipelined(self, host: str) -> bytes:
        """A request that keeps the connection (each kind answered with a body)."""
        kind = self.rng.randrange(4)
        if kind == 0:  # any standard method, any path of no route: 404
            method = self.rng.choice(sorted(METHODS - {"HEAD", "CONNECT", "WEBSOCKET"}))
            # ("/" alone is the web console's page: a route)
            target = "/" + (self.text(_PATH, 1, 60).lstrip("/") or "x").replace("//", "/x/")
        elif kind == 1:  # a session that does not exist: 404
            method, target = "GET", "/v1/sessions/" + self.text(string.ascii_letters, 1, 40)
        elif kind == 2:  # a query no route takes: 400
            method, target = "GET", "/v1/sessions?limit=x" + self.text(string.ascii_letters, 0, 30)
        else:  # a body that is not UTF-8 JSON: 400
            body = self.text(string.printable, 1, 80).encode()
            sid = self.text(string.ascii_letters, 1, 20)
            head = f"POST /v1/sessions/{sid}/turns HTTP/1.1\r\nHost: {host}\r\n"
            head += f"Content-Length: {len(body) + 1}\r\n\r\n"
            return head.encode() + b"\xff" + body
        return f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()

    def refused(self, host: str) -> bytes:
        """A request refused below the application (the connection is then closed)."""
        if self.rng.randrange(2):  # a method of any spelling: 501
            method = self.text(_TOKEN, 1, 20)
            if method in METHODS:
                method = "M" + method
            return f"{method} /{self.text(_PATH, 0, 30)} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        bad_host = self.text(string.ascii_lowercase, 1, 10) + ".." + self.text("abc", 0, 5)
        return f"GET /healthz HTTP/1.1\r\nHost: {bad_host}\r\n\r\n".encode()


async def _send(url: str, hostile: Hostile, count: int) -> None:
    """``count`` requests: batches of 50 pipelined on one connection, and every tenth
    on its own connection (refused below the application)."""
    sent = 0
    while sent < count:
        raw = await Raw.open(url)
        if sent % 500 < 50:
            for _ in range(min(50, count - sent)):
                refused = await Raw.open(url)
                await refused.send(hostile.refused(refused.host))
                reply = parse_reply(await refused.until_closed())
                assert reply.status in (400, 501), reply
                sent += 1
        batch = min(50, count - sent)
        await raw.send(b"".join(hostile.pipelined(raw.host) for _ in range(batch)))
        data, answered = b"", 0
        with trio.fail_after(GUARD):
            while answered < batch:
                data += await raw.stream.receive_some(65536)
                while b"\r\n\r\n" in data:
                    head = data.partition(b"\r\n\r\n")[0]
                    length = int(head.lower().partition(b"content-length: ")[2].split(b"\r\n")[0])
                    if len(data) < len(head) + 4 + length:
                        break
                    reply = parse_reply(data)
                    assert reply.status in (400, 404), reply
                    data, answered = reply.rest, answered + 1
        sent += batch
        await raw.aclose()


# 2,500 requests through one in-process server.  Each hostile request has its own random
# method, path, query or body: a label taken from any of them would add a series per
# request, so 2,000 show a leak as surely as 10,000 did (57 s alone at load 6 on two cores).
@pytest.mark.timeout(300)
async def test_two_thousand_hostile_requests_add_no_series(start_server: ServerFactory) -> None:
    server = await start_server()
    hostile = Hostile(seed=22)
    await _send(server.url, hostile, WARM_UP)
    await server.client.get("/metrics")  # a scrape is counted once it is answered
    before = series((await server.client.get("/metrics")).text)
    await _send(server.url, hostile, HOSTILE)
    after = series((await server.client.get("/metrics")).text)
    assert after == before, sorted(after ^ before)[:20]
    requests = [labels for name, labels in after if name == "trioserve_http_requests_total"]
    assert all(dict(labels)["method"] in METHODS | {"OTHER"} for labels in requests)


def test_labels_outside_the_closed_sets_are_folded() -> None:
    """What the HTTP layer or an adapter hands in beyond the sets counts as OTHER / other."""

    class Exchange:
        def __init__(self, method: str) -> None:
            self.method, self.route, self.status = method, "unmatched", 404
            self.duration, self.websocket = 0.001, False

    class Turn:
        def __init__(self, reason: str, protocol: str) -> None:
            self.end = TurnEnd(TurnStatus.FAILED, reason, utcnow())
            self.admitted_at, self.outcome, self.warm = 0.0, None, False
            self.adapter, self.protocol = "cold", protocol

    metrics = Metrics()
    for n in range(100):
        metrics.ended(Exchange(f"M{n}"))
        metrics.turn_ended(Turn(f"adapter-reason-{n}", f"face-{n}"), None)
    text = metrics.exposition()[0].decode()
    found = series(text)
    methods = {dict(labels)["method"] for name, labels in found if name.endswith("requests_total")}
    ended = [dict(labels) for name, labels in found if name.endswith("ended_total")]
    reasons = {labels["reason"] for labels in ended}
    protocols = {labels["protocol"] for labels in ended}
    assert (methods, reasons, protocols) == ({"OTHER"}, {"other"}, {"other"})
