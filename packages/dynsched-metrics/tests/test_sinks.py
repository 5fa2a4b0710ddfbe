"""Exporters: flat dict, JSON lines, Prometheus, entry-point discovery."""

from __future__ import annotations

import json
import re

import pytest
from dynsched_metrics import (
    CYCLE_METRIC_KEYS,
    MQ_SIZE,
    SINK_ENTRY_POINT_GROUP,
    TRAIN_RESOURCE_UTILIZATION,
    CycleMetrics,
    DictSink,
    JsonLinesSink,
    MetricsSink,
    available_sinks,
    build_sink,
    read_json_lines,
    to_flat_dict,
)


def record(step=4, cycle=1, **over):
    metrics = dict.fromkeys(CYCLE_METRIC_KEYS, 0.5)
    metrics[MQ_SIZE] = 7
    metrics.update(over)
    return CycleMetrics(
        cycle=cycle,
        step=step,
        metrics=metrics,
        first_step=step - 1,
        num_steps=2,
        time=10.0,
        x=0.25,
        wait_s=1.0,
        step_s=4.0,
    )


def test_flat_dict_is_logger_ready():
    flat = to_flat_dict(record())
    assert set(flat) == set(CYCLE_METRIC_KEYS)
    assert all(isinstance(v, int | float) for v in flat.values())
    assert to_flat_dict(record(), prefix="run1/")["run1/" + MQ_SIZE] == 7


def test_dict_sink_forwards_to_callback_with_step():
    calls = []
    sink = DictSink(lambda metrics, step: calls.append((step, metrics)))
    sink.write(record(step=4))
    sink.write(record(step=8, cycle=2))
    assert [s for s, _ in calls] == [4, 8]
    assert sink.rows[1]["step"] == 8 and sink.rows[1][TRAIN_RESOURCE_UTILIZATION] == 0.5


def test_json_lines_round_trip(tmp_path):
    path = tmp_path / "sub" / "metrics.jsonl"
    with JsonLinesSink(path, extra={"run": "dyn"}) as sink:
        sink.write(record(step=4))
        sink.write(record(step=8, cycle=2, **{TRAIN_RESOURCE_UTILIZATION: float("nan")}))
    rows = read_json_lines(path)
    assert [r["step"] for r in rows] == [4, 8]
    assert rows[0]["run"] == "dyn" and rows[0]["cycle"] == 1
    assert rows[1][TRAIN_RESOURCE_UTILIZATION] is None  # NaN is not valid JSON
    for line in path.read_text().splitlines():
        json.loads(line)
    with pytest.raises(ValueError, match="closed"):
        sink.write(record())
    JsonLinesSink(path, append=True).write(record(step=12))
    assert [r["step"] for r in read_json_lines(path)] == [4, 8, 12]


def test_builtin_sinks_are_discoverable_through_entry_points(tmp_path):
    assert SINK_ENTRY_POINT_GROUP == "dynsched.metrics_sinks"
    assert {"dict", "jsonl", "prometheus"} <= set(available_sinks())
    assert isinstance(build_sink("dict"), DictSink)
    jsonl = build_sink("jsonl", path=tmp_path / "m.jsonl")
    assert isinstance(jsonl, JsonLinesSink) and isinstance(jsonl, MetricsSink)
    jsonl.close()
    with pytest.raises(KeyError, match="Did you mean 'jsonl'"):
        build_sink("jsonll")


def test_prometheus_names_and_values():
    prom = build_sink("prometheus", run="dyn")
    prom.write(record(step=4, **{"dynamic_resource/train_compute_time_s": 3.0}))
    prom.write(record(step=8, cycle=2, **{"dynamic_resource/train_compute_time_s": 2.0}))
    text = prom.exposition()
    names = set(re.findall(r"^(dynsched_\w+?)(?:\{|\s)", text, flags=re.M))
    for name in names:
        assert re.fullmatch(r"dynsched_[a-z_]+", name)
    assert 'dynsched_train_resource_utilization_ratio{run="dyn"} 0.5' in text
    assert 'dynsched_rollout_resource_utilization_ratio{run="dyn"} 0.5' in text
    assert 'dynsched_resource_utilization_ratio{run="dyn"} 0.5' in text
    assert 'dynsched_train_compute_seconds_total{run="dyn"} 5.0' in text
    assert 'dynsched_cycle_train_compute_seconds{run="dyn"} 2.0' in text
    assert 'dynsched_sync_cycles_total{run="dyn"} 2.0' in text
    assert 'dynsched_mq_size{run="dyn"} 7.0' in text
    assert 'dynsched_train_step{run="dyn"} 8.0' in text
    # utilizations end in _ratio, times in _seconds, counters in _total; one label only
    assert all(lbl == "run" for lbl in re.findall(r"\{(\w+)=", text))
    utils = [n for n in names if "utilization" in n]
    assert utils and all(n.endswith("_ratio") for n in utils)
    prom.close()


def test_two_prometheus_sinks_do_not_collide():
    a = build_sink("prometheus", run="a")
    b = build_sink("prometheus", run="b")
    assert a.registry is not b.registry


def test_prometheus_http_server_binds_loopback_unless_given_an_address():
    """The exporter is not on the network unless asked (issue 27)."""
    import socket
    import urllib.request

    import prometheus_client  # noqa: F401  (the [prometheus] extra; CI installs it: never skip)
    from dynsched_metrics import PrometheusSink

    sink = PrometheusSink(run="sec", port=0)
    try:
        server = sink.server[0] if isinstance(sink.server, tuple) else sink.server
        host, port = server.socket.getsockname()[:2]
        assert (server.socket.family, host) == (socket.AF_INET, "127.0.0.1")
        sink.write(record(step=2))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as rsp:
            assert 'dynsched_train_step{run="sec"} 2.0' in rsp.read().decode()
    finally:
        sink.close()
    wide = PrometheusSink(run="wide", port=0, addr="0.0.0.0")  # an explicit choice
    try:
        server = wide.server[0] if isinstance(wide.server, tuple) else wide.server
        assert server.socket.getsockname()[0] == "0.0.0.0"
    finally:
        wide.close()


def test_a_sink_name_two_distributions_provide_is_refused(monkeypatch):
    """Sinks follow dynsched's one plug-in rule (dynsched_core.plugins)."""
    from importlib import metadata

    from dynsched_metrics import SinkLookupError

    class Dist:
        def __init__(self, name):
            self.metadata = {"Name": name}
            self.entry_points = [
                metadata.EntryPoint("dup", "dynsched_metrics:DictSink", "dynsched.metrics_sinks")
            ]

    monkeypatch.setattr(metadata, "distributions", lambda: [Dist("dist-one"), Dist("dist-two")])
    assert available_sinks() == ["dup"]
    with pytest.raises(SinkLookupError, match="'dist-one' and 'dist-two'") as err:
        build_sink("dup")
    assert isinstance(err.value, KeyError)
