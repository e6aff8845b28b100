"""Prometheus exposition of what the recorder is doing (served at admin-guarded ``/metrics``).

Uses ``prometheus_client`` with a registry per recorder instance, so two recorders in one process
(tests, white-box runs beside a loop-owning server) never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class RecorderMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter("oeh_calls", "Calls served, by kind and record status", ["call_kind", "status"], registry=r)
        self.errors = Counter("oeh_errors", "Calls that ended in an error, by kind", ["kind"], registry=r)
        self.rejected = Counter("oeh_rejected", "Requests refused before reaching the engine", ["reason"], registry=r)
        self.budget_stops = Counter("oeh_budget_stops", "Sessions stopped by a budget cap", ["cap"], registry=r)
        self.tool_cuts = Counter("oeh_tool_call_cuts", "Replies whose tool calls a cap cut", ["cap"], registry=r)
        self.replays = Counter("oeh_retry_replays", "Retried calls answered from the record", registry=r)
        self.transitions = Counter(
            "oeh_chain_transitions", "Agent-call transitions by fidelity class", ["fidelity"], registry=r
        )
        self.transition_causes = Counter(
            "oeh_chain_transition_causes", "Non-exact agent-call transitions by class and cause", ["fidelity", "cause"],
            registry=r)
        self.template_certified = Gauge(
            "oeh_template_certified", "The served template: 1 certified, 0 failed, -1 uncertified", registry=r)
        self.template_property = Gauge(
            "oeh_template_property", "Each certification property: 1 pass, 0 fail, -1 unchecked", ["property"],
            registry=r)
        self.records = Counter("oeh_records_stored", "Records committed to the store", registry=r)
        self.straddled = Counter("oeh_straddled_sync", "Calls whose generation straddled a weight sync", registry=r)
        self.latency = Histogram(
            "oeh_call_seconds", "Time from request to reply", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.upstream_latency = Histogram(
            "oeh_upstream_seconds", "Time spent waiting for the engine", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.overhead = Histogram(
            "oeh_overhead_seconds", "Recorder time per call excluding the engine", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.sessions = Gauge("oeh_sessions", "Sessions by status", ["status"], registry=r)
        self.policy_version = Gauge("oeh_policy_version", "Current policy version", registry=r)
        self.paused = Gauge("oeh_engine_paused", "1 while the weight-sync fence is closed", registry=r)
        self.store_accepting = Gauge("oeh_store_accepting_records",
                                     "1 while the store takes records, 0 while every call is refused", registry=r)
        self.store_unindexed = Gauge("oeh_store_unindexed_records",
                                     "Acknowledged records kept only in the journal after indexing failed", registry=r)
        self.store_backlog = Gauge("oeh_store_index_backlog", "Records journalled and not yet indexed", registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
