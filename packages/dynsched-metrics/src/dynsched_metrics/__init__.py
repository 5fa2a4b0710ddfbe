"""dynsched-metrics: Utilization metrics, event-history recorder, aggregator, exporters and plots for dynsched."""

from __future__ import annotations

__version__ = "0.1.0"

__all__: list[str] = []
