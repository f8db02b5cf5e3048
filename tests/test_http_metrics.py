"""The request metrics (``_metrics.RequestMeter``): plain counters read at each scrape, exposed as
the Counter and Histogram prometheus_client kept before (same names, labels and buckets)."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from aioelastic.store.http._metrics import LATENCY_BUCKETS, ServerMetrics
from aioelastic.store.memory import MemoryEngine


def _samples(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render()[0].decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_requests_are_counted_by_op_and_code_and_timed_in_inclusive_buckets() -> None:
    metrics = ServerMetrics(MemoryEngine())
    for seconds in (0.0001, 0.0005, 0.0006, 2.0, 1000.0):  # 0.0005 is on a bound: le is <=
        metrics.observe("get", 200, seconds)
    metrics.observe("get", 404, 0.001)
    metrics.observe("put", 200, 0.01)
    samples = _samples(metrics)
    assert samples[("aioelastic_requests_total", (("code", "200"), ("op", "get")))] == 5
    assert samples[("aioelastic_requests_total", (("code", "404"), ("op", "get")))] == 1
    assert samples[("aioelastic_requests_total", (("code", "200"), ("op", "put")))] == 1

    def bucket(op: str, le: str) -> float:
        return samples[("aioelastic_request_duration_seconds_bucket", (("le", le), ("op", op)))]

    assert bucket("get", "0.0005") == 2
    assert bucket("get", "0.001") == 4  # cumulative: the 404's 1 ms too
    assert bucket("get", "1.0") == 4
    assert bucket("get", "5.0") == 5
    assert bucket("get", "300.0") == 5
    assert bucket("get", "+Inf") == 6
    assert bucket("put", "0.005") == 0
    assert bucket("put", "0.01") == 1
    count = samples[("aioelastic_request_duration_seconds_count", (("op", "get"),))]
    total = samples[("aioelastic_request_duration_seconds_sum", (("op", "get"),))]
    assert count == 6
    assert total == pytest.approx(1002.0022)
    les = {labels[0][1] for name, labels in samples if name.endswith("_bucket")}
    assert les == {repr(float(b)) for b in LATENCY_BUCKETS} | {"+Inf"}
