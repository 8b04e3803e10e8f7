"""A bug clinic: the cached generation loop with one thing deliberately broken at a time.

Each bug is a mistake people make when they write a KV-cache loop (the worked example lists where to
look: position offset, causal mask, per-layer cache length, GQA head mapping; the walk-through feeds
decode the last prompt token). `run_with_bug` runs the loop with one bug switched on and
`check_run` compares every round's last-position logits with a full recompute of the context
the loop claims to have. The check catches a bug when a difference is not ~0 or the loop
raised. Never use these forwards for anything but showing what goes wrong.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.kernels import Kernels
from ..core.model import Model
from ..core.ops import attention, rmsnorm
from ..core.reference import decoder_block, embed_tokens, forward
from ..core.validate import check_token_ids, is_int
from ..decoding.sampling import greedy

BUGS = {
    "none": "the correct loop",
    "position_offset": "a decode step places its new token at position 0 instead of after the cache",
    "no_causal_mask": "attention has no causal mask, so prefill positions see their future",
    "gqa_head_mapping": "query head h reads KV head h % Hkv instead of h // (Hq // Hkv)",
    "truncated_layer_cache": "after prefill, the last layer's cache loses its last row",
    "whole_sequence_every_step": "every round feeds the whole sequence again, appending it to the cache",
    "last_prompt_token": "every decode step feeds the last prompt token instead of the newly chosen one",
}


def attention_without_mask(q, k, v):
    """Attention where every query sees every key, future included (the mask bug).

    Built from the library's attention: a single query is always the newest position, so
    its causal mask hides nothing; running each query alone therefore drops the mask."""
    return np.concatenate([attention(q[i:i + 1], k, v) for i in range(q.shape[0])])  # [S, Hq*d]


def attention_mod_head_map(q, k, v):
    """Grouped-query attention with the wrong head mapping: query head h reads KV head h % Hkv.

    The K/V heads are laid out per query head (as repeat_kv does) with that wrong index, and
    the library's attention runs as multi-head attention on them."""
    Hq, Hkv = q.shape[1], k.shape[1]
    wrong = np.arange(Hq) % Hkv  # right: np.arange(Hq) // (Hq // Hkv)
    return attention(q, k[:, wrong], v[:, wrong])


def forward_with(model: Model, token_ids, cache, *, start=None, attend=attention):
    """A cached forward like `forward`, built from the same ops, with two things exposed:
    `start`, the position of the first new token (default: the cache length, which is right),
    and `attend(q [S,Hq,d], k [T,Hkv,d], v) -> [S, Hq*d]`. Returns logits [S, V]."""
    past = len(cache)
    n = len(check_token_ids(model.config, token_ids))
    start = past if start is None else int(start)
    kernels = Kernels(attention=lambda q, k, v: attend(q, k, v).reshape(q.shape))  # heads apart: [S, Hq, d]
    return forward(model, token_ids, cache, positions=np.arange(start, start + n), kernels=kernels)


@dataclass
class BugRun:
    bug: str
    tokens: list  # the prompt and the tokens the loop chose
    prompt_length: int
    logits: list = field(default_factory=list)  # per round, the last position's logits [V]
    contexts: list = field(default_factory=list)  # per round, the context the loop claims: tokens so far
    cache_lengths: list = field(default_factory=list)  # per round, the cache length after it
    error: str | None = None  # the message of the error that stopped the loop, if any

    @property
    def new_tokens(self) -> list:
        return self.tokens[self.prompt_length:]


def run_with_bug(model: Model, prompt, max_new_tokens: int, bug: str = "none") -> BugRun:
    """The cached greedy loop (prefill, then one token a round) with `bug` switched on."""
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; choose one of {list(BUGS)}")
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    tokens = [int(t) for t in check_token_ids(model.config, prompt)]
    run = BugRun(bug, list(tokens), len(tokens))
    cache = model.new_cache()
    attend = {"no_causal_mask": attention_without_mask,
              "gqa_head_mapping": attention_mod_head_map}.get(bug, attention)
    for step in range(1, max_new_tokens + 1):
        context = list(run.tokens)
        if step == 1:
            new, start = context, None
        elif bug == "whole_sequence_every_step":
            new, start = context, None
        elif bug == "last_prompt_token":
            new, start = [tokens[-1]], None
        elif bug == "position_offset":
            new, start = context[-1:], 0
        else:
            new, start = context[-1:], None
        try:
            logits = forward_with(model, new, cache, start=start, attend=attend)[-1]  # [V]
        except ValueError as e:
            run.error = str(e)
            break
        run.logits.append(logits)
        run.contexts.append(context)
        run.cache_lengths.append(len(cache))
        run.tokens.append(greedy(logits))
        if bug == "truncated_layer_cache" and step == 1:
            cache.lengths[-1] -= 1  # one layer forgets a row
    return run


def check_run(model: Model, run: BugRun) -> list:
    """Per completed round: max |the loop's last logits - forward(model, context)[-1]|, where
    context is what the loop claims to hold (the prompt and the tokens chosen so far)."""
    return [float(np.max(np.abs(logits - forward(model, ctx)[-1])))
            for logits, ctx in zip(run.logits, run.contexts)]


def diagnose(model: Model, prompt, max_new_tokens: int, bug: str, tol: float = 1e-9) -> dict:
    """Run one bug and the check: max difference, cache lengths, error, and which checks caught it
    ("error", "logits", "cache length"; empty when none did).

    A run counts as caught when it raised, when some round's logits differ from the full
    recompute by more than `tol`, or when its cache length is not the context length."""
    run = run_with_bug(model, prompt, max_new_tokens, bug)
    diffs = check_run(model, run)
    expected = [len(ctx) for ctx in run.contexts]
    if run.error is not None:
        caught_by = ["error"]
    else:
        caught_by = (["logits"] if any(x > tol for x in diffs) else []) + \
                    (["cache length"] if run.cache_lengths != expected else [])
    return {"bug": bug, "tokens": run.new_tokens, "max_diff": max(diffs) if diffs else None,
            "diffs": diffs, "cache_lengths": run.cache_lengths, "expected_lengths": expected,
            "error": run.error, "caught_by": caught_by, "caught": bool(caught_by)}


def decode_fed_hidden_state(model: Model, prompt) -> dict:
    """the walk-through's first decode step against the right one. After the prefill the seed starts
    layer 0 from the prefill's last hidden state (what the last block returned at the last
    position) instead of the embedding of the token the prefill chose.

    Returns "chosen" (the prefill's greedy token), the next position's logits [V] the right way
    ("right": embed the chosen token, one cached step), the seed's way ("seed"), and by full
    recompute of prompt + chosen ("full"), and the two layer-0 inputs [1, D] ("right_input",
    "seed_input")."""
    cfg = model.config
    ids = [int(t) for t in check_token_ids(cfg, prompt)]
    positions = np.arange(len(ids))
    cache = model.new_cache(len(ids) + 1)
    x = embed_tokens(model, ids, positions)  # [S, D]
    for l, layer in enumerate(model.layers):
        x = decoder_block(layer, x, positions, cache.layer(l))
    last_hidden = x[-1:]  # [1, D]: the last block's output at the last position
    chosen = greedy((rmsnorm(last_hidden, model.final_norm, cfg.norm_eps) @ model.lm_head)[-1])
    seed_cache = cache.copy(1)
    right = forward(model, [chosen], cache)[-1]  # the chosen token's embedding enters layer 0
    new_position = np.array([len(ids)])
    h = last_hidden  # the seed: the prefill's output enters layer 0 again
    for l, layer in enumerate(model.layers):
        h = decoder_block(layer, h, new_position, seed_cache.layer(l))
    seed = (rmsnorm(h, model.final_norm, cfg.norm_eps) @ model.lm_head)[-1]
    return {"chosen": chosen, "right": right, "seed": seed, "full": forward(model, ids + [chosen])[-1],
            "right_input": embed_tokens(model, [chosen], new_position), "seed_input": last_hidden}
