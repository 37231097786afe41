"""``GET /metrics``: the Prometheus exposition, on the API and on ``--metrics-bind``."""

from __future__ import annotations

from typing import Final

from quart import Response
from quart_trio import QuartTrio

from trioserve.http import _accesslog as accesslog
from trioserve.observe import Metrics

#: The path of the exposition, on the API port and on ``--metrics-bind``.
PATH: Final = "/metrics"


def install(app: QuartTrio, metrics: Metrics) -> None:
    """Access lines and request metrics for ``app``, and ``GET /metrics`` (behind its guard)."""
    accesslog.install(app, metrics)
    _route(app, metrics)


def exposition_app(metrics: Metrics) -> QuartTrio:
    """The app of ``--metrics-bind``: ``GET /metrics`` only, no key, no access lines."""
    app = QuartTrio("trioserve-metrics")
    _route(app, metrics)
    return app


def _route(app: QuartTrio, metrics: Metrics) -> None:
    @app.get(PATH)
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, content_type=content_type)
