"""dynsched-metrics: utilization metrics, event-history recorder, aggregator, exporters, plots.

The metric definitions are pure functions (`rollout_resource_utilization`,
`train_resource_utilization`, `cluster_resource_utilization`, ...). `MetricsRecorder`
builds the histories from a core `EventBus`; `MetricsAggregator` closes one sync cycle
at a time and hands each cycle's metrics to exporters (`DictSink`, `JsonLinesSink`,
`PrometheusSink`, or any sink registered in the ``dynsched.metrics_sinks`` entry-point
group). Plots need the ``plot`` extra, Prometheus the ``prometheus`` extra.
"""

from __future__ import annotations

from dynsched_metrics._aggregator import CycleMetrics, MetricsAggregator, MetricsSink
from dynsched_metrics._definitions import (
    CYCLE_METRIC_KEYS,
    MQ_SIZE,
    RESOURCE_UTILIZATION,
    ROLLOUT_RESOURCE_UTILIZATION,
    STEP_GENERATED_SAMPLES,
    TRAIN_ALLOCATED_TIME_S,
    TRAIN_COMPUTE_KEYS,
    TRAIN_COMPUTE_TIME_S,
    TRAIN_RESOURCE_UTILIZATION,
    cluster_resource_utilization,
    correct_placeholder_capacity,
    hybrid_rollout_fraction,
    mq_size,
    rollout_capacity,
    rollout_resource_utilization,
    rollout_resource_utilization_arrays,
    step_generated_samples,
    train_compute_time,
    train_resource_utilization,
)
from dynsched_metrics._plots import (
    MODE_COLORS,
    ModeInterval,
    mode_intervals,
    plot_queue_size,
    plot_resource_layout,
    plot_run,
    plot_utilizations,
)
from dynsched_metrics._recorder import MetricsRecorder, RolloutWindow, TrainCycle
from dynsched_metrics._sinks import (
    SINK_ENTRY_POINT_GROUP,
    DictSink,
    JsonLinesSink,
    SinkLookupError,
    available_sinks,
    build_sink,
    read_json_lines,
    to_flat_dict,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # PrometheusSink imports prometheus-client only when asked for.
    if name == "PrometheusSink":
        from dynsched_metrics._prometheus import PrometheusSink

        return PrometheusSink
    raise AttributeError(f"module 'dynsched_metrics' has no attribute {name!r}")


__all__ = [
    "CYCLE_METRIC_KEYS",
    "MODE_COLORS",
    "MQ_SIZE",
    "RESOURCE_UTILIZATION",
    "ROLLOUT_RESOURCE_UTILIZATION",
    "SINK_ENTRY_POINT_GROUP",
    "STEP_GENERATED_SAMPLES",
    "TRAIN_ALLOCATED_TIME_S",
    "TRAIN_COMPUTE_KEYS",
    "TRAIN_COMPUTE_TIME_S",
    "TRAIN_RESOURCE_UTILIZATION",
    "CycleMetrics",
    "DictSink",
    "JsonLinesSink",
    "MetricsAggregator",
    "MetricsRecorder",
    "MetricsSink",
    "ModeInterval",
    "PrometheusSink",
    "RolloutWindow",
    "SinkLookupError",
    "TrainCycle",
    "available_sinks",
    "build_sink",
    "cluster_resource_utilization",
    "correct_placeholder_capacity",
    "hybrid_rollout_fraction",
    "mode_intervals",
    "mq_size",
    "plot_queue_size",
    "plot_resource_layout",
    "plot_run",
    "plot_utilizations",
    "read_json_lines",
    "rollout_capacity",
    "rollout_resource_utilization",
    "rollout_resource_utilization_arrays",
    "step_generated_samples",
    "to_flat_dict",
    "train_compute_time",
    "train_resource_utilization",
]
