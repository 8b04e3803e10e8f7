"""Measuring disaggregation honestly on this machine (notebook 23): the same workload served
three ways, each told which cores it may use and how many threads it runs.

- colocated: the continuous-batching `Engine` (serving.engine) on one rank with every core: each
  step decodes every running request and prefills every arrived prompt whole;
- chunked: the same engine with a token budget per step (chunked prefill: decodes first, then
  prompt chunks until the budget is spent);
- disaggregated: `disagg.disaggregated_rank` on two ranks, each pinned to its own core(s).

    runs = measure("smollm2", workload, chunk_budget=32)
    runs["chunked"]["tpot"], runs["disaggregated"]["facts"]   # gaps in seconds; cores, threads
    for line in conclusions(summarize(runs)): print(line)

Each rank pins itself (os.sched_setaffinity) and sets numba's thread count to its number of
cores before any kernel runs; BLAS gets the same count (run_ranks' `threads`). Every sentence
`conclusions` returns is chosen by comparing the measured numbers."""
from __future__ import annotations

import os
import time

import numpy as np

from .. import fast
from ..fast.compiled import jit
from ..serving.engine import Engine
from ..serving.requests import Request
from .disagg import check_workload, disaggregated_rank
from .launch import run_ranks
from .tp import resolve_model


def split_cores(n_cores: int | None = None) -> dict:
    """Which cores each mode's ranks get: colocated [[all]], disaggregated [[first half], [rest]]."""
    n = n_cores or os.cpu_count() or 1
    if n < 2:
        raise ValueError(f"disaggregation on one machine needs at least 2 cores (one per rank), this one has {n}")
    cores = list(range(n))
    return {"colocated": [cores], "chunked": [cores], "disaggregated": [cores[: n // 2], cores[n // 2:]]}


def pin(cores) -> dict:
    """Pin this process to `cores` and run numba's kernels on that many threads; return the facts."""
    if cores is not None:
        os.sched_setaffinity(0, set(int(c) for c in cores))
        if jit.available():
            import numba

            numba.set_num_threads(min(len(cores), numba.config.NUMBA_NUM_THREADS))
    return rank_facts()


def cpu_model() -> str:
    """The processor's name, from /proc/cpuinfo (Linux), else what platform says."""
    import platform

    try:
        for line in open("/proc/cpuinfo"):
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def rank_facts() -> dict:
    facts = {"pid": os.getpid(), "cores": sorted(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
             "numba_threads": None, "blas_threads": None}
    if jit.available():
        import numba
        from threadpoolctl import threadpool_info

        facts["numba_threads"] = numba.get_num_threads()
        facts["blas_threads"] = max((p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"),
                                    default=None)
    return facts


def warm_up(model) -> None:
    """Run the shapes a workload will run (a prompt, a mixed batch, a decode batch) once, before
    the clock starts: a fresh process loads the weights and numba's kernels on first use."""
    cfg = model.config
    n = max(1, min(64, cfg.max_context - 16))
    ids = [i % cfg.vocab_size for i in range(1, n + 9)]
    a, b = model.new_cache(capacity=n + 2), model.new_cache(capacity=10)
    fast.forward(model, ids[:n], a, last_only=True)
    fast.forward_batch(model, [ids[:1], ids[n:n + 8]], [a, b], last_only=True)
    fast.forward_batch(model, [ids[1:2], ids[2:3]], [a, b], last_only=True)


def engine_rank(comm, model="small", workload=(), token_budget: int | None = None, deadline: float = 120.0,
                cores=None) -> dict:
    """Serve `workload` (disagg.TimedRequests, arrivals in seconds) with one Engine on this rank.
    token_budget None: unchunked (every arrived prompt whole in the next step); an integer: chunked
    prefill under that many tokens per step. Returns tokens, TPOT gaps, per-step seconds and rows."""
    facts = pin(cores[comm.Get_rank()] if cores else None)
    model = resolve_model(model)
    warm_up(model)
    pending = check_workload(workload)
    engine = Engine(model, token_budget=token_budget, keep_logits=False)
    index, times, steps = {}, {}, []
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0
    while pending or engine.busy:
        if clock() > deadline:
            raise TimeoutError(f"the colocated engine passed its deadline of {deadline:g} s")
        while pending and pending[0].arrival <= clock():
            r = pending.pop(0)
            index[engine.add(Request(r.prompt, r.max_new_tokens, name=str(r.id)))] = r.id
        if not engine.busy:
            time.sleep(min(0.01, max(0.0, pending[0].arrival - clock())))
            continue
        start = clock()
        log = engine.step()
        now = clock()
        decodes = sum(w.n_tokens for w in log.entries if w.phase == "decode")
        steps.append((now - start, decodes, log.batch_tokens - decodes))
        for i, rid in index.items():
            got = times.setdefault(rid, [])
            got += [now] * (len(engine.results[i].tokens) - len(got))
    tokens = {rid: list(engine.results[i].tokens) for i, rid in index.items()}
    gaps = [float(b - a) for t in times.values() for a, b in zip(t, t[1:])]
    return {"tokens": tokens, "tpot": gaps, "steps": steps, "facts": facts}


def pinned_disaggregated_rank(comm, model="small", cores=None, **kwargs) -> dict:
    """disagg.disaggregated_rank, after pinning this rank to cores[rank] and warming it up; its facts added."""
    facts = pin(cores[comm.Get_rank()] if cores else None)
    model = resolve_model(model)
    warm_up(model)
    return disaggregated_rank(comm, model=model, **kwargs) | {"facts": facts}


def measure(model, workload, chunk_budget: int = 32, timeout: float = 600.0, cores: dict | None = None) -> dict:
    """The workload served colocated, chunked (token budget `chunk_budget`) and disaggregated,
    with the cores of split_cores() (or `cores`); {mode: what its ranks returned}."""
    cores = cores or split_cores()
    base = dict(model=model, workload=list(workload), deadline=0.9 * timeout)
    out = {}
    for mode, budget in (("colocated", None), ("chunked", chunk_budget)):
        out[mode] = run_ranks(1, "tinydecoder.parallel.disagg_bench:engine_rank",
                              base | dict(token_budget=budget, cores=cores[mode]), timeout=timeout,
                              threads=len(cores[mode][0]))[0]
    prefill, decode = run_ranks(2, "tinydecoder.parallel.disagg_bench:pinned_disaggregated_rank",
                                base | dict(cores=cores["disaggregated"]), timeout=timeout,
                                threads=len(cores["disaggregated"][1]))
    out["disaggregated"] = decode | {"prefill": prefill}
    return out


def summarize(runs: dict) -> dict:
    """Per mode: p50/p99 TPOT (s), their ratio, the decode steps and how many also prefilled."""
    out = {}
    for mode, run in runs.items():
        g = np.asarray(run["tpot"], dtype=np.float64)
        row = {"p50": float(np.percentile(g, 50)), "p99": float(np.percentile(g, 99)), "samples": len(g)}
        row["ratio"] = row["p99"] / row["p50"]
        if mode == "disaggregated":
            steps = run["step_seconds"]
            row.update(decode_steps=len(steps), mixed_steps=0, max_prefill_rows=0,
                       decode_only_step=float(np.median(steps)),
                       kv_bytes=int(sum(run["prefill"]["bytes_sent"].values())),
                       kv_seconds=float(sum(run["recv_seconds"].values())),
                       prefill_seconds=float(sum(run["prefill"]["prefill_seconds"].values())))
        else:
            decoding = [s for s in run["steps"] if s[1] > 0]
            only = [s[0] for s in decoding if s[2] == 0]
            row.update(decode_steps=len(decoding), mixed_steps=sum(1 for s in decoding if s[2] > 0),
                       max_prefill_rows=max((s[2] for s in decoding), default=0),
                       decode_only_step=float(np.median(only)) if only else float("nan"))
        out[mode] = row
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _times(a: float, b: float) -> str:
    """'2.3x higher' / '1.8x lower' / 'about the same' for a against b."""
    r = a / b
    if 1 / 1.1 < r < 1.1:
        return "about the same as"
    return f"{r:.1f}x higher than" if r > 1 else f"{1 / r:.1f}x lower than"


def conclusions(s: dict, facts: dict | None = None, load: float | None = None) -> list:
    """Sentences from summarize()'s numbers, each worded by comparing them (so none can contradict them).
    facts: {"colocated": ..., "disaggregated": ...} rank facts (cores); load: the load average meanwhile."""
    co, ch, di = s["colocated"], s["chunked"], s["disaggregated"]
    lines = []
    flat = min(s, key=lambda m: s[m]["ratio"])
    ratios = ", ".join(f"{m} {s[m]['ratio']:.1f}" for m in s)
    lines.append(("Tail: the disaggregated decode rank had the flattest time per output token" if flat == "disaggregated"
                  else f"Tail: {flat}, not the disaggregated decode rank, had the flattest time per output token")
                 + f" (p99 / p50: {ratios}).")
    if co["mixed_steps"] == 0:
        lines.append("Isolation: no colocated step held a prefill together with decodes, so this run did not test it.")
    else:
        lines.append(f"Isolation: {co['mixed_steps']} of the colocated engine's {co['decode_steps']} decoding steps also "
                     f"prefilled (up to {co['max_prefill_rows']} prompt rows in one step), {ch['mixed_steps']} of the "
                     f"chunked engine's {ch['decode_steps']} (at most {ch['max_prefill_rows']} rows); the decode rank's "
                     f"{di['decode_steps']} steps held decodes only.")
    if facts:
        k, n = len(facts["disaggregated"]["cores"]), len(facts["colocated"]["cores"])
        r = di["decode_only_step"] / co["decode_only_step"]
        verb = ("took about as long as" if 1 / 1.1 < r < 1.1 else f"took {r:.1f}x as long as" if r > 1
                else f"was {1 / r:.1f}x faster than")
        lines.append(f"Cost of a side each: a decode-only step on the decode rank's {k} core(s) {verb} one on the "
                     f"colocated engine's {n} cores (medians {_ms(di['decode_only_step'])} and "
                     f"{_ms(co['decode_only_step'])})"
                     + ("." if r >= 1 / 1.1 else
                        ": more threads did not help, since a pass split over threads waits for the slowest of them"
                        + (f", and this machine's other programs (load average {load:.1f} on {os.cpu_count()} cores) "
                           "kept taking cores from them." if load is not None and load > (os.cpu_count() or 1) else ".")))
    share = di["kv_seconds"] / di["prefill_seconds"]
    lines.append(f"Cost of the transfer: {di['kv_bytes']:,} bytes of KV cache took {_ms(di['kv_seconds'])} to receive, "
                 f"{100 * share:.2g}% of the {_ms(di['prefill_seconds'])} spent computing them.")
    for other, row in (("colocated", co), ("chunked", ch)):
        p99, p50 = _times(di["p99"], row["p99"]), _times(di["p50"], row["p50"])
        if di["p99"] < row["p99"] / 1.1:
            what = "bought the tail" + (" at the price of the median" if di["p50"] > row["p50"] * 1.1 else "")
        elif di["p99"] > row["p99"] * 1.1:
            what = "lost the tail"
        else:
            what = "did not change the tail"
        lines.append(f"Against {other}: disaggregation {what} here (p99 {_ms(di['p99'])}, {p99} {_ms(row['p99'])}; "
                     f"p50 {_ms(di['p50'])}, {p50} {_ms(row['p50'])}).")
    return lines
