"""The fork server's metrics (issue 30), read from its ``ForkStats`` when scraped.

A collector rather than counters fed by the layers: the figures are the fork
server's own (``runtime._forker.ForkServer.stats``), counted where they
happen; with ``--fork-server off`` (or an adapter it cannot fork) every
figure is 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from trioserve.runtime import ForkServer


class ForkServerCollector:
    """``trioserve_fork_server_*``: up, forks, fallbacks, restarts, the median fork time."""

    def __init__(self, forker: ForkServer | None) -> None:
        self._forker = forker

    def collect(self) -> Iterator[Metric]:
        stats = self._forker.stats if self._forker is not None else None
        up = GaugeMetricFamily(
            "trioserve_fork_server_up",
            "1 while the fork server is ready to fork turns; 0 while it is down or starting"
            " (turns exec their adapter) and with --fork-server off",
        )
        up.add_metric([], 1.0 if stats is not None and stats.state == "ready" else 0.0)
        yield up
        counters = (
            ("trioserve_fork_server_forks", "Turn processes forked by the fork server", "forks"),
            (
                "trioserve_fork_server_fallbacks",
                "Turns that exec'd their adapter because the fork server was not ready",
                "fallbacks",
            ),
            (
                "trioserve_fork_server_restarts",
                "Times the fork server exited and was started again",
                "restarts",
            ),
        )
        for name, text, field in counters:
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], float(getattr(stats, field)) if stats is not None else 0.0)
            yield counter
        seconds = GaugeMetricFamily(
            "trioserve_fork_seconds",
            "Median time to fork a turn's process, request to pid (the last 100 forks; 0 until"
            " the first)",
        )
        median = stats.fork_p50() if stats is not None else None
        seconds.add_metric([], median or 0.0)
        yield seconds
