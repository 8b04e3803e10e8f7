"""The server's Prometheus metrics, in a registry of their own (so that two servers in one
process, as in the tests, do not collide). Served as text by GET /metrics."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest  # noqa: F401

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.running = Gauge("tinydecoder_requests_running", "Requests admitted to the engine and not finished", registry=r)
        self.waiting = Gauge("tinydecoder_requests_waiting", "Requests waiting for admission (new or preempted)",
                             registry=r)
        self.blocks_used = Gauge("tinydecoder_kv_blocks_used", "KV blocks held by running requests", registry=r)
        self.blocks_free = Gauge("tinydecoder_kv_blocks_free", "KV blocks free (cached prefix blocks included)",
                                 registry=r)
        self.blocks_total = Gauge("tinydecoder_kv_blocks_total", "KV blocks in the pool", registry=r)
        self.prefix_hits = Counter("tinydecoder_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache",
                                   registry=r)
        self.preemptions = Counter("tinydecoder_preemptions", "Running requests preempted for lack of KV blocks",
                                   registry=r)
        self.prompt_tokens = Counter("tinydecoder_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generated_tokens = Counter("tinydecoder_generation_tokens", "Tokens generated", registry=r)
        self.requests = Counter("tinydecoder_requests", "Requests ended, by how they ended", ["finish_reason"],
                                registry=r)
        self.steps = Counter("tinydecoder_engine_steps", "Engine steps that ran a forward pass", registry=r)
        self.ttft = Histogram("tinydecoder_time_to_first_token_seconds", "From arrival to the first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("tinydecoder_time_per_output_token_seconds",
                              "Per request: (finish - first token) / (tokens - 1)", buckets=TPOT_BUCKETS, registry=r)

    def text(self) -> bytes:
        return generate_latest(self.registry)


def parse_metrics(text: str) -> dict:
    """{sample name (with labels, as written): value} from Prometheus text (for tests and notebooks)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out
