"""What a scenario reports (``Result``, its ``Metric``s) and the statistics it uses."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Metric:
    """One reported figure, with its target if it has one."""

    name: str
    value: float
    unit: str
    target: str = ""
    met: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": self.target or None,
            "met": self.met,
        }


@dataclass
class Result:
    scenario: str
    title: str
    metrics: list[Metric] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def add(
        self,
        name: str,
        value: float,
        unit: str,
        target: str = "",
        met: bool | None = None,
    ) -> None:
        self.metrics.append(Metric(name, value, unit, target, met))

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "metrics": [m.as_dict() for m in self.metrics],
            "details": self.details,
        }


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) with linear interpolation."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def latency_summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_ms": ms(percentile(samples, 50)),
        "p90_ms": ms(percentile(samples, 90)),
        "p99_ms": ms(percentile(samples, 99)),
        "min_ms": ms(min(samples)),
        "max_ms": ms(max(samples)),
        "mean_ms": ms(statistics.fmean(samples)),
    }
