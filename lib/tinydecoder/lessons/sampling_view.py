"""Notebook 09's sampling widget, as data: what the bars show for one setting of temperature,
top-k and top-p. (A lesson helper; the sampler itself is decoding/sampling.py.)"""
from __future__ import annotations

from ..decoding.sampling import check_logits, is_greedy, probabilities, rank_tokens, sampling_distribution


def distribution_view(logits, temperature=None, top_k=None, top_p=None, n_show: int = 15) -> dict:
    """What the sampling widget draws: the `n_show` best tokens (by logit, ties by id) with
    their probability at temperature 1 ("base") and under these settings ("probs"), which of
    them a sampler can return ("kept"), and for the whole vocabulary the number of tokens kept
    and the base mass they hold.  Arrays are [n_show]."""
    logits = check_logits(logits)
    probs = sampling_distribution(logits, temperature, top_k, top_p)  # [V]
    base = probabilities(logits)  # [V], temperature 1, nothing filtered
    ids = rank_tokens(logits)[:n_show]
    kept_all = probs > 0
    return {"ids": ids, "base": base[ids], "probs": probs[ids], "kept": kept_all[ids],
            "n_kept": int(kept_all.sum()), "kept_base_mass": float(base[kept_all].sum()),
            "greedy": is_greedy(temperature, top_k, top_p),
            "settings": {"temperature": temperature, "top_k": top_k, "top_p": top_p}}
