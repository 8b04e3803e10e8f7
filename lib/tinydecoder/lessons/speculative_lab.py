"""Measurements and their sentences for notebook 15 (speculative decoding).

A sentence about a number measured on this machine is printed by code from that measurement, so
the notebook's prose cannot contradict its own output on another machine: `explain_pass_cost`,
`explain_speedup`, `dots_vs_curve`. `greedy_rounding` measures why greedy speculative decoding
returns `generate`'s tokens: the rounding difference of a many-row pass against the smallest gap
between the two best logits. `early_exit_agreement` and `simulate_tokens_per_step` are the
chapter's experiments.
"""
from __future__ import annotations

import numpy as np

from .. import fast
from ..core.model import Model
from ..core.validate import is_int
from ..decoding.speculative import expected_tokens_per_step


def simulate_tokens_per_step(alpha: float, k: int, n_steps: int, rng) -> np.ndarray:
    """Tokens per pass of n_steps simulated passes, each guess kept i.i.d. with probability alpha:
    1 + (number of leading kept guesses).  -> [n_steps] ints in 1..k+1"""
    kept = np.random.default_rng(rng).random((n_steps, k)) < alpha  # [n_steps, k]
    return 1 + np.cumprod(kept, axis=1).sum(axis=1)


def early_exit_agreement(model: Model, token_ids, start: int, layers=None) -> dict:
    """How often an early exit after L blocks (then the final norm and head) picks the full
    model's greedy token, at every position from `start - 1` on (predicting token_ids[start:]
    and one more), with the true context before it: the greedy acceptance rate of the
    early-exit draft's first guess.  -> {L: fraction}, for L in `layers` (default 1..n_layers)."""
    from ..core.ops import rmsnorm
    from ..core.reference import decoder_block, embed_tokens
    from ..core.reference import forward as reference_forward
    from ..core.validate import check_token_ids

    cfg = model.config
    ids = check_token_ids(cfg, token_ids)
    if not 1 <= start <= len(ids):
        raise ValueError(f"start must be in 1..{len(ids)} (the number of tokens given), got {start}")
    layers = sorted(set(range(1, cfg.n_layers + 1) if layers is None else layers))
    if not layers or not 1 <= layers[0] <= layers[-1] <= cfg.n_layers:
        raise ValueError(f"layers must lie in 1..{cfg.n_layers}, got {layers}")
    positions = np.arange(len(ids))
    cache = model.new_cache(len(ids))
    x = embed_tokens(model, ids, positions)  # [T, D]
    picks = {}
    for layer in range(layers[-1]):
        x = decoder_block(model.layers[layer], x, positions, cache.layer(layer))
        if layer + 1 in layers:
            h = rmsnorm(x[start - 1:], model.final_norm, cfg.norm_eps)  # [T - start + 1, D]
            picks[layer + 1] = np.argmax(h @ model.lm_head, axis=-1)  # [T - start + 1]
    full = np.argmax(reference_forward(model, ids)[start - 1:], axis=-1) if cfg.n_layers not in picks else picks[cfg.n_layers]
    return {L: float(np.mean(p == full)) for L, p in picks.items()}


def _check_seconds(pass_s) -> dict:
    if not isinstance(pass_s, dict) or 1 not in pass_s or len(pass_s) < 2:
        raise ValueError("pass_s must be a dict {rows: seconds} with 1 row and at least one more "
                         f"(as widgets.speculative.verify_pass_seconds returns), got {pass_s!r}")
    if any(not s > 0 for s in pass_s.values()):
        raise ValueError(f"every time in pass_s must be > 0 seconds, got {pass_s!r}")
    return pass_s


def explain_pass_cost(pass_s: dict) -> str:
    """One sentence on what a verification pass cost here, from {rows: seconds}: the costs in
    decode steps against the roofline's prediction (about one step while the weights dominate,
    judged on the passes of up to 4 rows; wider ones are also reported, where the arithmetic
    begins to show)."""
    pass_s = _check_seconds(pass_s)
    ratio = {n: s / pass_s[1] for n, s in sorted(pass_s.items()) if n > 1}
    listed = ", ".join(f"{n} rows {r:.2f}x" for n, r in ratio.items())
    few = {n: r for n, r in ratio.items() if n <= 4} or ratio
    worst = max(few.values())
    if worst <= 1.5:
        verdict = (f"up to {max(few)} rows at most {worst:.2f} steps, close to the roofline's prediction of about "
                   "one step, as the memory-bound argument says")
    else:
        verdict = (f"up to {max(few)} rows as much as {worst:.1f} steps, above the roofline's ~1 step: this kernel "
                   "multiplies a few rows more slowly than it streams the weights for one (notebook 11, cause 1), "
                   "so each guess costs part of a step here")
    wide = {n: r for n, r in ratio.items() if n > max(few)}
    if wide:
        n, r = max(wide.items())
        verdict += (f"; a pass over {n} rows cost {r:.1f} steps, "
                    + ("less than" if r < n else "as much as") + f" {n} separate steps")
    return f"On this machine one pass over n rows costs, in decode steps: {listed}; that is {verdict}."


def explain_speedup(label: str, seconds: float, plain_seconds: float, tokens_per_pass: float) -> str:
    """One sentence on a measured speed-up: `generate`'s wall clock over the speculative run's (both
    for the same tokens, as greedy gives). Its reason is computed from the same numbers: the
    speed-up is tokens per pass divided by what one pass cost in plain decode steps (the pass's
    draft and its share of the prefill included), so that cost is printed, not assumed."""
    if not (seconds > 0 and plain_seconds > 0 and tokens_per_pass >= 1):
        raise ValueError(f"need seconds > 0, plain_seconds > 0 and tokens_per_pass >= 1, got "
                         f"{seconds}, {plain_seconds}, {tokens_per_pass}")
    speedup = plain_seconds / seconds
    how = "faster than" if speedup >= 1.05 else "slower than" if speedup <= 0.95 else "as fast as"
    step = tokens_per_pass / speedup  # one pass's wall clock over one plain step's
    if step > 1.05:
        why = (f", less than its {tokens_per_pass:.2f} tokens per pass: each pass (with its draft and its "
               f"share of the prefill) took {step:.2f}x a plain decode step")
    elif step < 0.95:
        why = (f", more than its {tokens_per_pass:.2f} tokens per pass: each pass took only {step:.2f}x a "
               "plain decode step")
    else:
        why = f", about its {tokens_per_pass:.2f} tokens per pass: each pass took about one plain decode step"
    return f"{label}: {speedup:.2f}x, {how} plain generate{why}."


def dots_vs_curve(runs: dict) -> list:
    """For each {label: SpeculativeGeneration}: (label, alpha, k, measured tokens per pass, the
    independent-acceptance formula at that alpha and k, 'above' / 'below' / 'on'). Runs that
    proposed nothing are left out (alpha is undefined there)."""
    rows = []
    for label, r in runs.items():
        if not r.draft_tokens_proposed:
            continue
        alpha, k, measured = r.acceptance_rate, r.draft_tokens, r.tokens_per_step
        model = float(expected_tokens_per_step(alpha, k))
        side = "above" if measured > model + 0.05 else "below" if measured < model - 0.05 else "on"
        rows.append((label, alpha, k, measured, model, side))
    return rows


def greedy_rounding(model: Model, tokens, prompt_length: int, rows: int = 5) -> dict:
    """Compare the logits of one-row decode steps with those of `rows`-row passes over the same
    tokens (the fast path, as generate and speculative_generate run it), along a greedy run:
    {"max_difference": largest |logit difference|, "min_margin": smallest gap between the best
    and the second-best logit of the one-row steps, "same_argmax": whether every position picks
    the same token both ways, "positions": how many were compared}.
    Greedy speculative decoding returns generate's tokens when min_margin > 2 * max_difference."""
    tokens = [int(t) for t in tokens]
    if not 1 <= prompt_length < len(tokens):
        raise ValueError(f"prompt_length must be in 1..{len(tokens) - 1}, got {prompt_length}")
    if not is_int(rows) or rows < 2:
        raise ValueError(f"rows must be an integer >= 2 (a pass over several rows), got {rows!r}")
    one = model.new_cache(len(tokens))
    single = [fast.forward(model, tokens[:prompt_length], one, last_only=True)[-1]]
    for t in tokens[prompt_length:-1]:
        single.append(fast.forward(model, [t], one)[-1])
    single = np.stack(single)  # [N, V]: the logits predicting tokens[prompt_length:]
    many = model.new_cache(len(tokens))
    passes = [fast.forward(model, tokens[:prompt_length], many, last_only=True)[-1:]]
    for a in range(prompt_length, len(tokens) - 1, rows):
        passes.append(fast.forward(model, tokens[a:min(a + rows, len(tokens) - 1)], many))
    multi = np.concatenate(passes)  # [N, V]
    top2 = np.sort(single, axis=-1)[:, -2:]
    return {"max_difference": float(np.max(np.abs(multi.astype(np.float64) - single))),
            "min_margin": float(np.min(top2[:, 1] - top2[:, 0])),
            "same_argmax": bool(np.array_equal(single.argmax(-1), multi.argmax(-1))),
            "positions": int(single.shape[0])}
