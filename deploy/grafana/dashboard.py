"""Writes deploy/grafana/proctor-dashboard.json: the Grafana dashboard over Proctor's metrics.

The panels are listed here once (title, unit, PromQL); ``python deploy/grafana/dashboard.py`` rewrites the
JSON that Grafana provisions, and tests/deploy/test_grafana_dashboard.py checks the two agree, that every
query parses (promtool) and that every metric it names is one the server exports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).with_name("proctor-dashboard.json")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (legend, PromQL)
    description: str = ""
    kind: str = "timeseries"


def quantiles(metric: str, by: str = "") -> tuple[tuple[str, str], ...]:
    group = f"le{', ' + by if by else ''}"
    legend = f"{{{{{by}}}}} " if by else ""
    return tuple((f"{legend}p{q}", f"histogram_quantile(0.{q}, sum by ({group}) (rate({metric}_bucket[{RATE}])))")
                 for q in ("50", "95", "99"))


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Traffic", (
        Panel("Generated tokens per second", "short", (
            ("all replicas", f"sum(rate(proctor:generation_tokens_total[{RATE}]))"),
            ("{{instance}}", f"sum by (instance) (rate(proctor:generation_tokens_total[{RATE}]))"))),
        Panel("Calls per second by method", "reqps", (
            ("{{method}}", f"sum by (method) (rate(proctor:requests_total[{RATE}]))"),)),
        Panel("Errors per second by code", "reqps", (
            ("{{code}}", f'sum by (code) (rate(proctor:requests_total{{code!="OK"}}[{RATE}]))'),),
            "Server errors (INTERNAL, UNAVAILABLE, ...) alert above 1% of calls; RESOURCE_EXHAUSTED is shedding."),
        Panel("Server error ratio", "percentunit", (
            ("server errors", f'sum(rate(proctor:requests_total{{code=~"INTERNAL|UNKNOWN|DATA_LOSS|UNAVAILABLE|'
                              f'UNIMPLEMENTED"}}[{RATE}])) / sum(rate(proctor:requests_total[{RATE}]))'),),
            "Alert ProctorErrorRateHigh: > 1% for 5 minutes."),
    )),
    ("Latency", (
        Panel("Time to first token", "s", quantiles("proctor:time_to_first_token_seconds"),
              "Alert ProctorTimeToFirstTokenP99High: p99 > 2 s for 5 minutes."),
        Panel("Time per output token", "s", quantiles("proctor:time_per_output_token_seconds")),
        Panel("Request latency (arrival to last response)", "s",
              quantiles("proctor:e2e_request_latency_seconds", "method")),
        Panel("Queue time", "s", quantiles("proctor:request_queue_time_seconds")),
    )),
    ("Engine", (
        Panel("Requests waiting and running", "short", (
            ("waiting {{instance}}", "proctor:num_requests_waiting"),
            ("running {{instance}}", "proctor:num_requests_running")),
            "Waiting requests drive the autoscaler (deploy/k8s/base/hpa.yaml)."),
        Panel("Decode step time", "s", quantiles("proctor:decode_step_seconds")),
        Panel("Prefill time", "s", quantiles("proctor:prefill_seconds")),
        Panel("KV cache used", "percentunit", (
            ("{{instance}}", "proctor:kv_cache_used_bytes / proctor:kv_cache_total_bytes"),)),
        Panel("Finish reasons", "reqps", (
            ("{{reason}}", f"sum by (reason) (rate(proctor:request_finished_total[{RATE}]))"),)),
        Panel("Repetition stops (share of finished requests)", "percentunit", (
            ("repetition", f"sum(rate(proctor:repetition_stops_total[{RATE}])) / "
                           f"sum(rate(proctor:request_finished_total[{RATE}]))"),),
            "Alert ProctorRepetitionStopsHigh: > 15% for 15 minutes."),
    )),
    ("Constraints", (
        Panel("Constraint cache hit ratio", "percentunit", (
            ("{{engine}}", f"sum by (engine) (rate(proctor:constraint_cache_hits_total[{RATE}])) / (sum by (engine) "
                           f"(rate(proctor:constraint_cache_hits_total[{RATE}])) + sum by (engine) "
                           f"(rate(proctor:constraint_cache_misses_total[{RATE}])))"),)),
        Panel("Constraint compile time", "s", quantiles("proctor:constraint_compile_seconds", "engine")),
        Panel("Compile failures and invalid outputs per second", "short", (
            ("compile failures {{engine}}",
             f"sum by (engine) (rate(proctor:constraint_compile_failures_total[{RATE}]))"),
            ("schema-invalid outputs", f"sum(rate(proctor:schema_invalid_outputs_total[{RATE}]))"))),
        Panel("Mask time per step", "s", quantiles("proctor:mask_seconds")),
    )),
    ("Audit trail", (
        Panel("Audit lag: records waiting for the writer", "short", (
            ("{{instance}}", "proctor:audit_queue_depth"),)),
        Panel("Audit batch commit time", "s", quantiles("proctor:audit_write_seconds")),
        Panel("Audit records written and failed per second", "short", (
            ("written {{instance}}", f"rate(proctor:audit_records_written_total[{RATE}])"),
            ("failed {{instance}}", f"rate(proctor:audit_write_failures_total[{RATE}])")),
            "Any failure fires ProctorAuditWriteFailed: in compliance mode those calls failed closed."),
    )),
)


def build() -> dict[str, object]:
    panels: list[dict[str, object]] = []
    next_id, y = 1, 0
    for row_title, row_panels in ROWS:
        panels.append({"type": "row", "title": row_title, "id": next_id, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        next_id, y = next_id + 1, y + 1
        for index, panel in enumerate(row_panels):
            panels.append({
                "type": panel.kind, "title": panel.title, "id": next_id, "description": panel.description,
                "datasource": DATASOURCE,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": y + 8 * (index // 2)},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                            "tooltip": {"mode": "multi", "sort": "desc"}},
                "targets": [{"refId": chr(ord("A") + number), "datasource": DATASOURCE, "expr": expr,
                             "legendFormat": legend} for number, (legend, expr) in enumerate(panel.queries)],
            })
            next_id += 1
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "uid": "proctor-overview", "title": "Proctor", "tags": ["proctor"], "timezone": "browser",
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
