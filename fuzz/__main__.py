"""``python -m fuzz [--duration S] [--seed N] [--json PATH]``: see the package doc."""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

from fuzz import Findings, mutator, schema
from fuzz.server import Server

_BATCH = 100
#: Descriptors the server may hold above its count before the run (pool connections, logs).
_FD_SLACK = 8


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds in all")
    parser.add_argument("--seed", type=int, default=None, help="the raw mutator's seed")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    findings = Findings()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trioserve-fuzz-") as tmp:
        server = Server(Path(tmp), ["--max-sessions", "0"])
        server.start()
        try:
            client = httpx.Client(base_url=server.url, timeout=60)
            session_id = client.post("/v1/sessions", json={}).json()["id"]
            turn = client.post(f"/v1/sessions/{session_id}/turns", json={"input": "seed"})
            turn_id = client.get(f"/v1/sessions/{session_id}/turns").json()[0]["id"]
            assert turn.status_code == 200, turn.text
            server.check(findings, "start")
            fds, children = server.fds(), server.children()
            schema.run(server.url, session_id, args.duration * 0.4, seed, findings)
            server.check(findings, "schemathesis")
            rng = random.Random(seed)
            end = started + args.duration
            batch = 0
            while time.monotonic() < end:
                batch += 1
                mutator.run_batch(server.port, session_id, turn_id, rng, _BATCH, findings)
                server.check(findings, f"raw batch {batch}")
            _check_leaks(server, client, fds, children, findings)
            client.close()
        finally:
            server.stop(findings)
    figures = {
        "seed": seed,
        "duration_s": round(time.monotonic() - started, 1),
        "requests": findings.requests,
        "requests_total": sum(v for k, v in findings.requests.items() if "rounds" not in k),
        "findings": len(findings.found),
    }
    print(json.dumps(figures, indent=2))
    for found in findings.found[:20]:
        print(json.dumps(found, indent=2)[:3000], file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps({**figures, "found": findings.found}, indent=2))
    return 1 if findings.found else 0


def _check_leaks(
    server: Server, client: httpx.Client, fds: int, children: set[int], findings: Findings
) -> None:
    """Once the turns the run started are over: no more descriptors or children than before."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = client.get("/metrics").text
        busy = any(
            line.startswith("trioserve_running_turns ") and float(line.split()[1]) > 0
            for line in running.splitlines()
        )
        if not busy and server.fds() <= fds + _FD_SLACK and server.children() <= children:
            return
        time.sleep(0.2)
    findings.add(
        "leak",
        detail=f"descriptors {fds} -> {server.fds()}, children {children} -> {server.children()}",
    )


if __name__ == "__main__":
    sys.exit(main())
