"""Clients for a running server: many concurrent streaming requests through the official
`openai` client, each one's timeline (sent, first token, every token, finish), and the
summary a load test reports. Used by tools/load_test.py and notebook 21.

    timelines = run_clients(server.url, "toy", jobs, concurrency=4)   # jobs: [(prompt, max_tokens)]
    summarize(timelines)    # throughput, TTFT p50/p99, TPOT p50/p99 (seconds; never compare them)
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Timeline:
    """One request as its client saw it. Times are seconds since the run started."""

    index: int
    prompt: object
    max_tokens: int
    sent: float = 0.0
    token_times: list = field(default_factory=list)  # when each streamed piece arrived
    finished: float = 0.0
    text: str = ""
    completion_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.sent

    @property
    def tpot(self) -> float | None:
        """(last piece - first piece) / (tokens - 1): the decode pace this client saw."""
        n = self.completion_tokens
        return None if n < 2 else (self.token_times[-1] - self.token_times[0]) / (n - 1)


async def _one(client, model, i, prompt, max_tokens, t0, chat, extra) -> Timeline:
    tl = Timeline(i, prompt, max_tokens)
    tl.sent = time.perf_counter() - t0
    kw = dict(model=model, max_tokens=max_tokens, temperature=0, stream=True,
              stream_options={"include_usage": True}, **extra)
    if chat:
        stream = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kw)
    else:
        stream = await client.completions.create(prompt=prompt, **kw)
    pieces = []
    async for chunk in stream:
        if chunk.usage is not None:
            tl.completion_tokens, tl.prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        piece = choice.delta.content if chat else choice.text
        if piece:
            tl.token_times.append(time.perf_counter() - t0)
            pieces.append(piece)
        if choice.finish_reason:
            tl.finish_reason = choice.finish_reason
    tl.finished = time.perf_counter() - t0
    tl.text = "".join(pieces)
    if not tl.token_times:
        tl.token_times.append(tl.finished)
    return tl


async def _run(url, model, jobs, concurrency, chat, timeout, extra) -> list:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=timeout)
    gate = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()

    async def guarded(i, job):
        async with gate:
            return await _one(client, model, i, job[0], job[1], t0, chat, extra)
    try:
        return await asyncio.wait_for(asyncio.gather(*[guarded(i, j) for i, j in enumerate(jobs)]), timeout)
    finally:
        await client.close()


def run_clients(url: str, model: str, jobs, concurrency: int = 1, *, chat: bool = False, timeout: float = 600.0,
                **extra) -> list:
    """Send `jobs` ([(prompt, max_tokens)]) as greedy streaming requests, at most `concurrency`
    in flight (1 = one at a time); the whole run is bounded by `timeout` seconds. Returns one
    Timeline per job, in job order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
    run = lambda: asyncio.run(_run(url, model, list(jobs), int(concurrency), chat, timeout, extra))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with ThreadPoolExecutor(1) as pool:  # inside Jupyter an event loop already runs on this thread
        return pool.submit(run).result()


def summarize(timelines) -> dict:
    """Throughput (completion tokens per second of wall time) and TTFT/TPOT percentiles (s)."""
    wall = max(t.finished for t in timelines) - min(t.sent for t in timelines)
    ttft = [t.ttft for t in timelines]
    tpot = [t.tpot for t in timelines if t.tpot is not None]
    tokens = sum(t.completion_tokens for t in timelines)

    def pct(xs, q):
        return float(np.percentile(xs, q)) if xs else None
    return {"requests": len(timelines), "completion_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else None,
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "tpot_p50_s": pct(tpot, 50), "tpot_p99_s": pct(tpot, 99)}


def plot_timelines(ax, timelines, *, title=None, labels=None):
    """One row per request: a thin line from sent to finished, a thick bar from the first token
    to the last, a dot for every streamed piece, a star at the first token (TTFT = star - start)."""
    for row, t in enumerate(timelines):
        y = len(timelines) - 1 - row
        ax.plot([t.sent, t.finished], [y, y], color="0.6", lw=1, zorder=1)
        ax.plot([t.token_times[0], t.token_times[-1]], [y, y], color="C0", lw=6, alpha=0.35, zorder=2,
                solid_capstyle="butt")
        ax.scatter(t.token_times, [y] * len(t.token_times), s=9, color="C0", zorder=3)
        ax.scatter([t.sent], [y], marker="|", s=120, color="k", zorder=4)
        ax.scatter([t.token_times[0]], [y], marker="*", s=90, color="C3", zorder=5)
    names = labels or [f"request {t.index}" for t in timelines]
    ax.set_yticks(range(len(timelines)), names[::-1])
    ax.set_xlabel("seconds since the first request was sent (this machine, this run)")
    ax.set_title(title or "each request as its client saw it: | sent, ★ first token, • pieces, end = finished")
    ax.grid(axis="x", alpha=0.3)
    return ax
