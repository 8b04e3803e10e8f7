"""Colocated, colocated with chunked prefill, and disaggregated serving on a MACHINE MODEL: an
event simulation whose steps cost what a few parameters say, so the three can be compared at a
scale no laptop reaches (notebook 23). Deterministic: the same parameters give the same numbers.

A step on a side of g devices (GPUs, or cores) that decodes r requests and prefills p prompt
tokens takes

    (step_base_s + r * decode_row_s + p * prefill_token_s) / g

(step_base_s: reading the weights once; the split over g devices is taken as ideal). A prompt's
KV cache crosses the link in link_latency_s + kv_bytes_per_token * S / link_bytes_per_s.

- colocated: one engine on all `devices`; every step decodes every running request and prefills
  every waiting prompt whole (a decode step may hold a long prefill);
- chunked: the same engine, with a token budget per step: decodes first, then prompt chunks
  (oldest first) until the budget is spent (Sarathi-style chunked prefill);
- disaggregated: `prefill_devices` run prompts one at a time and ship each cache; the other
  `devices - prefill_devices` run decode-only steps, and a request joins them when its cache
  has arrived.

    m = Machine.h100_like()
    w = workload(rate=4.0, prompt_tokens=2048, new_tokens=128, n_requests=200, seed=0)
    r = simulate(m, w, "disaggregated")
    r.p(99), r.p(50), r.ttft_p(99)          # seconds
    sweep(m, rates, lambda rate: workload(rate, 2048, 128))  # {mode: [p99 TPOT per rate]}

TPOT counts every gap between two consecutive tokens of a request (disaggregated: the first gap
holds the transfer and the wait for the next decode step); TTFT is arrival to first token."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODES = ("colocated", "chunked", "disaggregated")


@dataclass(frozen=True)
class Machine:
    step_base_s: float  # one step's fixed cost on ONE device (the weights read once)
    decode_row_s: float  # each decoding request adds this to a step on one device
    prefill_token_s: float  # each prompt token adds this to a step on one device
    kv_bytes_per_token: int  # bytes of one prompt token's KV cache on the wire
    link_bytes_per_s: float  # the link between prefill and decode devices
    link_latency_s: float = 0.0
    devices: int = 2  # colocated: one engine on all of them
    prefill_devices: int = 1  # disaggregated: this many prefill, the rest decode
    token_budget: int = 512  # chunked: tokens per step, decodes included

    def __post_init__(self):
        for name in ("step_base_s", "prefill_token_s", "link_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Machine.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("decode_row_s", "link_latency_s", "kv_bytes_per_token"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"Machine.{name} must be >= 0, got {getattr(self, name)!r}")
        if not (isinstance(self.devices, int) and 2 <= self.devices):
            raise ValueError(f"Machine.devices must be an integer >= 2 (a side each), got {self.devices!r}")
        if not (isinstance(self.prefill_devices, int) and 1 <= self.prefill_devices < self.devices):
            raise ValueError(f"Machine.prefill_devices must be an integer in 1..{self.devices - 1}, "
                             f"got {self.prefill_devices!r}")
        if not (isinstance(self.token_budget, int) and self.token_budget >= 2):
            raise ValueError(f"Machine.token_budget must be an integer >= 2, got {self.token_budget!r}")

    def step_s(self, decode_rows: int, prefill_tokens: int, devices: int) -> float:
        return (self.step_base_s + decode_rows * self.decode_row_s + prefill_tokens * self.prefill_token_s) / devices

    def transfer_s(self, prompt_tokens: int) -> float:
        return self.link_latency_s + self.kv_bytes_per_token * prompt_tokens / self.link_bytes_per_s

    @classmethod
    def h100_like(cls, **change) -> Machine:
        """An 8-billion-parameter model in bfloat16 on H100-class GPUs, in round numbers: 16 GB of
        weights at ~3.3 TB/s (5 ms a step), 2 x 8e9 FLOP a prompt token at ~400 TFLOP/s (40 us),
        ~0.1 ms of KV reads per decoding request, 2 x 32 layers x 8 KV heads x 128 x 2 bytes =
        131,072 KV bytes per token over a 50 GB/s link with 20 us latency; 2 GPUs."""
        base = dict(step_base_s=5e-3, decode_row_s=1e-4, prefill_token_s=4e-5, kv_bytes_per_token=131_072,
                    link_bytes_per_s=50e9, link_latency_s=2e-5, devices=2, prefill_devices=1, token_budget=512)
        return cls(**(base | change))


@dataclass(frozen=True)
class Load:
    arrivals: tuple  # seconds
    prompt_tokens: tuple
    new_tokens: tuple


def workload(rate: float, prompt_tokens: int, new_tokens: int, n_requests: int = 200, seed: int = 0) -> Load:
    """n_requests arriving as a Poisson process of `rate` per second (seeded), each with a prompt
    of `prompt_tokens` and `new_tokens` to generate."""
    if not rate > 0 or prompt_tokens < 1 or new_tokens < 2 or n_requests < 1:
        raise ValueError(f"a workload needs rate > 0, prompt_tokens >= 1, new_tokens >= 2, n_requests >= 1; "
                         f"got {rate!r}, {prompt_tokens!r}, {new_tokens!r}, {n_requests!r}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n_requests)
    arrivals = np.cumsum(gaps) - gaps[0]
    return Load(tuple(float(a) for a in arrivals), (int(prompt_tokens),) * n_requests, (int(new_tokens),) * n_requests)


@dataclass
class Result:
    mode: str
    token_times: list  # per request: the time of each of its tokens
    arrivals: tuple
    prefill_steps_with_decodes: int = 0  # colocated modes: steps in which decodes waited for prompt rows
    steps: int = 0

    @property
    def tpot(self) -> np.ndarray:
        return np.concatenate([np.diff(t) for t in self.token_times])

    @property
    def ttft(self) -> np.ndarray:
        return np.array([t[0] - a for t, a in zip(self.token_times, self.arrivals)])

    def p(self, q: float) -> float:
        return float(np.percentile(self.tpot, q))

    def ttft_p(self, q: float) -> float:
        return float(np.percentile(self.ttft, q))


def _engine(m: Machine, load: Load, budget: int | None) -> Result:
    """One engine on all devices; budget None: every waiting prompt whole in the next step."""
    n = len(load.arrivals)
    times = [[] for _ in range(n)]
    left = list(load.prompt_tokens)  # prompt tokens not yet prefilled
    t, nxt, queue, decoding, mixed, steps = 0.0, 0, [], [], 0, 0
    while nxt < n or queue or decoding:
        while nxt < n and load.arrivals[nxt] <= t:
            queue.append(nxt)
            nxt += 1
        if not queue and not decoding:
            t = load.arrivals[nxt]
            continue
        room = float("inf") if budget is None else budget - len(decoding)
        chunks = []
        for i in queue:
            if room <= 0:
                break
            take = int(min(left[i], room))
            chunks.append((i, take))
            room -= take
        tokens = sum(c for _, c in chunks)
        t += m.step_s(len(decoding), tokens, m.devices)
        steps += 1
        mixed += bool(decoding and tokens)
        for i in decoding:
            times[i].append(t)
        for i, take in chunks:
            left[i] -= take
            if left[i] == 0:
                queue.remove(i)
                times[i].append(t)  # the last prompt row's logits pick the first token
                decoding.append(i)
        decoding = [i for i in decoding if len(times[i]) < load.new_tokens[i]]
    return Result("chunked" if budget else "colocated", times, load.arrivals, mixed, steps)


def _disaggregated(m: Machine, load: Load) -> Result:
    n = len(load.arrivals)
    times = [[] for _ in range(n)]
    ready, free = [], 0.0  # (time the cache is on the decode side, request); prefill side free at
    for i in range(n):  # the prefill side: one prompt after another, first come first served
        start = max(free, load.arrivals[i])
        free = start + m.step_s(0, load.prompt_tokens[i], m.prefill_devices)
        times[i].append(free)
        ready.append((free + m.transfer_s(load.prompt_tokens[i]), i))
    ready.sort()
    t, k, decoding, steps, g = 0.0, 0, [], 0, m.devices - m.prefill_devices
    while k < n or decoding:
        while k < n and ready[k][0] <= t:
            decoding.append(ready[k][1])
            k += 1
        if not decoding:
            t = ready[k][0]
            continue
        t += m.step_s(len(decoding), 0, g)
        steps += 1
        for i in decoding:
            times[i].append(t)
        decoding = [i for i in decoding if len(times[i]) < load.new_tokens[i]]
    return Result("disaggregated", times, load.arrivals, 0, steps)


def simulate(m: Machine, load: Load, mode: str) -> Result:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "disaggregated":
        return _disaggregated(m, load)
    return _engine(m, load, m.token_budget if mode == "chunked" else None)


def sweep(m: Machine, xs, make_load, q: float = 99) -> dict:
    """{mode: [the q-th percentile of TPOT, seconds, for the workload make_load(x)] for x in xs}."""
    out = {mode: [] for mode in MODES}
    for x in xs:
        load = make_load(x)
        for mode in MODES:
            out[mode].append(simulate(m, load, mode).p(q))
    return out


def crossover(xs, ours, theirs):
    """The first x at which `ours` drops below `theirs` (linear between the two grid points that
    bracket the change of sign), or None when it never does or already does at xs[0]."""
    xs, diff = np.asarray(xs, float), np.asarray(ours, float) - np.asarray(theirs, float)
    if diff[0] < 0:
        return None
    for j in range(1, len(xs)):
        if diff[j] < 0:
            return float(xs[j - 1] + (xs[j] - xs[j - 1]) * diff[j - 1] / (diff[j - 1] - diff[j]))
    return None
