"""Disaggregated prefill and decode: a prefill rank runs prompts and sends each request's KV cache
over MPI to a decode rank, which continues generation from it.

Why engines do this: in one engine, a step that prefills a long prompt is also the step in
which every running request decodes its next token, so those tokens wait for the prefill. Time
per output token gets a long tail. With the roles on separate ranks, decode steps hold only
decodes (flat), and the price is the KV transfer: 2 * L * Hkv * d * itemsize bytes per prompt
token (46,080 for SmolLM2 in float32).

    workload = [TimedRequest(0, prompt_ids, 32, arrival=0.0), ...]
    colocated = run_ranks(1, "tinydecoder.parallel.disagg:colocated_rank", dict(model=..., workload=...))[0]
    prefill, decode = run_ranks(2, "tinydecoder.parallel.disagg:disaggregated_rank", dict(...))
    serve(model, workload, mode="disaggregated", retries=1)   # the same, retried if a rank dies

Every wait is bounded (`deadline` seconds for the whole run): the decode rank polls for work
with Iprobe, the prefill rank's sends are tested, not waited on blindly."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from .. import fast
from ..core.cache import KVCache
from ..core.model import Model
from .launch import RankError, run_ranks
from .tp import resolve_model

HEADER, KV = 1, 2  # message tags: a request's header (pickled), then its KV block (a buffer)
POLL_SECONDS = 0.0005


@dataclass(frozen=True)
class TimedRequest:
    """A request as the ranks ship it: an id, its prompt, and its arrival in seconds after the start
    (the engine's `serving.requests.Request` counts arrival in steps)."""
    id: int
    prompt: tuple
    max_new_tokens: int
    arrival: float = 0.0  # seconds after the start


def kv_block(cache: KVCache) -> np.ndarray:
    """A cache's K and V as one contiguous [L, 2, T, Hkv, d] array: what goes over the wire."""
    n = len(cache)
    return np.stack([np.stack([k[:n], v[:n]]) for k, v in zip(cache.k, cache.v)])


def cache_from_block(model: Model, block: np.ndarray, extra: int) -> KVCache:
    """A KVCache holding a received [L, 2, T, Hkv, d] block, with room for `extra` more positions."""
    cfg = model.config
    L, _, n, hkv, d = block.shape
    if (L, hkv, d) != (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim):
        raise ValueError(f"KV block of shape {block.shape} does not fit {cfg.name}")
    cache = KVCache(cfg, model.dtype, capacity=n + extra)
    for l in range(L):
        cache.k[l][:n], cache.v[l][:n] = block[l, 0], block[l, 1]
    cache.lengths = [n] * L
    return cache


def kv_bytes(model: Model, prompt_tokens: int) -> int:
    """Bytes a request's KV cache takes on the wire: 2 * L * Hkv * d * itemsize per prompt token."""
    return model.config.kv_bytes_per_token(model.dtype.itemsize) * prompt_tokens


def check_workload(workload) -> list:
    out = []
    for r in workload:
        if not isinstance(r, TimedRequest):
            raise TypeError(f"the workload holds Requests, got {type(r).__name__}")
        out.append(r)
    if len({r.id for r in out}) != len(out):
        raise ValueError("request ids must be unique")
    return sorted(out, key=lambda r: (r.arrival, r.id))


def greedy(logits) -> int:
    return int(np.argmax(logits[-1]))


class Running:
    """A request being decoded: its cache, its tokens and the time each token came out."""

    def __init__(self, request: TimedRequest, cache: KVCache, first_token: int, t: float):
        self.request, self.cache, self.tokens, self.times = request, cache, [first_token], [t]

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.request.max_new_tokens


def decode_step(model: Model, running: list, clock) -> float:
    """One decode step for every running request (one batched pass); returns its seconds."""
    if not running:
        return 0.0
    start = clock()
    logits = fast.forward_batch(model, [[r.tokens[-1]] for r in running], [r.cache for r in running], last_only=True)
    now = clock()
    for r, lg in zip(running, logits):
        r.tokens.append(greedy(lg))
        r.times.append(now)
    return now - start


def report(finished: list) -> dict:
    """Tokens by request and every gap between two consecutive tokens of a request (time per output
    token; on the decode rank the first token's time is when its cache was received)."""
    gaps = [float(b - a) for r in finished for a, b in zip(r.times, r.times[1:])]
    return {"tokens": {r.request.id: r.tokens for r in finished}, "tpot": gaps}


def colocated_rank(comm, model="small", workload=(), deadline: float = 120.0) -> dict:
    """One engine does everything: each step prefills the prompts that have arrived AND decodes one
    token for every running request, in one batched pass (so those tokens wait for the prefill)."""
    model = resolve_model(model)
    pending, running, finished, prefill_seconds = check_workload(workload), [], [], {}
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0
    while pending or running:
        if clock() > deadline:
            raise TimeoutError(f"the colocated engine passed its deadline of {deadline:g} s")
        arrived = [r for r in pending if r.arrival <= clock()]
        if not arrived and not running:
            time.sleep(min(0.01, max(0.0, pending[0].arrival - clock())))
            continue
        pending = [r for r in pending if r not in arrived]
        caches = [KVCache(model.config, model.dtype, len(r.prompt) + r.max_new_tokens) for r in arrived]
        start = clock()
        logits = fast.forward_batch(model, [list(r.prompt) for r in arrived] + [[r.tokens[-1]] for r in running],
                                    caches + [r.cache for r in running], last_only=True)
        now = clock()
        for r, lg in zip(running, logits[len(arrived):]):
            r.tokens.append(greedy(lg))
            r.times.append(now)
        for req, cache, lg in zip(arrived, caches, logits):
            running.append(Running(req, cache, greedy(lg), now))
            prefill_seconds[req.id] = now - start  # the whole step (it also decoded the others)
        finished += [r for r in running if r.done]
        running = [r for r in running if not r.done]
    return report(finished) | {"prefill_seconds": prefill_seconds}


def disaggregated_rank(comm, model="small", workload=(), deadline: float = 120.0, fail_after: int | None = None) -> dict:
    """Rank 0 prefills and sends; rank 1 receives and decodes (run on 2 ranks).
    fail_after=k: the decode rank dies (os._exit) after receiving k requests (a crash, for the lesson)."""
    if comm.Get_size() != 2:
        raise ValueError(f"disaggregated serving runs on 2 ranks (prefill, decode), got {comm.Get_size()}")
    model = resolve_model(model)
    workload = check_workload(workload)
    comm.Barrier()
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0
    if comm.Get_rank() == 0:
        return prefill_worker(comm, model, workload, clock, deadline)
    return decode_worker(comm, model, workload, clock, deadline, fail_after)


def wait_bounded(request, clock, deadline: float, what: str) -> None:
    while not request.Test():
        if clock() > deadline:
            request.Cancel()
            raise TimeoutError(f"{what} did not complete within the deadline of {deadline:g} s")
        time.sleep(POLL_SECONDS)


def prefill_worker(comm, model: Model, workload: list, clock, deadline: float) -> dict:
    sent, prefill_seconds, send_seconds = {}, {}, {}
    for req in workload:
        while clock() < req.arrival:
            time.sleep(min(0.01, req.arrival - clock()))
        cache = KVCache(model.config, model.dtype, len(req.prompt))
        start = clock()
        first = greedy(fast.forward(model, list(req.prompt), cache, last_only=True))
        prefill_seconds[req.id] = clock() - start
        block = kv_block(cache)
        start = clock()
        wait_bounded(comm.isend((req.id, first, block.shape), dest=1, tag=HEADER), clock, deadline,
                     f"sending request {req.id}'s header to the decode rank")
        wait_bounded(comm.Isend(block, dest=1, tag=KV), clock, deadline,
                     f"sending request {req.id}'s KV cache to the decode rank")
        send_seconds[req.id] = clock() - start
        sent[req.id] = int(block.nbytes)
    return {"role": "prefill", "bytes_sent": sent, "prefill_seconds": prefill_seconds, "send_seconds": send_seconds}


def decode_worker(comm, model: Model, workload: list, clock, deadline: float, fail_after) -> dict:
    from mpi4py import MPI

    by_id = {r.id: r for r in workload}
    running, finished, received, recv_seconds, steps = [], [], {}, {}, []
    status = MPI.Status()
    while len(finished) < len(workload):
        if clock() > deadline:
            raise TimeoutError(f"the decode rank passed its deadline of {deadline:g} s with "
                               f"{len(workload) - len(finished)} request(s) unfinished")
        while comm.Iprobe(source=0, tag=HEADER, status=status):  # take every request waiting
            rid, first, shape = comm.recv(source=0, tag=HEADER)
            block = np.empty(shape, model.dtype)
            start = clock()
            wait_bounded(comm.Irecv(block, source=0, tag=KV), clock, deadline, f"receiving request {rid}'s KV cache")
            recv_seconds[rid] = clock() - start
            received[rid] = int(block.nbytes)
            req = by_id[rid]
            running.append(Running(req, cache_from_block(model, block, req.max_new_tokens), first, clock()))
            if fail_after is not None and len(received) >= fail_after:
                os._exit(3)  # a crash: no result, no goodbye
        finished += [r for r in running if r.done]
        running = [r for r in running if not r.done]
        if running:
            steps.append(decode_step(model, running, clock))
        else:
            time.sleep(POLL_SECONDS)
    return report(finished) | {"role": "decode", "bytes_received": received, "recv_seconds": recv_seconds,
                               "step_seconds": steps}


def serve(model, workload, *, retries: int = 1, timeout: float = 120.0, fail_after: int | None = None) -> dict:
    """Run `workload` disaggregated (2 ranks), again from the start if a rank dies, at most
    `retries` more times (fail_after: crash the decode rank on the first attempt only).
    Returns {"prefill": ..., "decode": ..., "attempts": [error, ..., "ok"]}; raises RuntimeError
    naming the requests not served when every attempt fails."""
    workload = check_workload(workload)
    attempts = []
    for attempt in range(retries + 1):
        kwargs = dict(model=model, workload=workload, deadline=0.9 * timeout,
                      fail_after=fail_after if attempt == 0 else None)
        try:
            prefill, decode = run_ranks(2, "tinydecoder.parallel.disagg:disaggregated_rank", kwargs, timeout=timeout)
        except RankError as exc:
            attempts.append(str(exc))
            continue
        return {"prefill": prefill, "decode": decode, "attempts": attempts + ["ok"]}
    raise RuntimeError(f"disaggregated serving failed on all {retries + 1} attempt(s); requests "
                       f"{[r.id for r in workload]} were not served. Last error: {attempts[-1]}")
