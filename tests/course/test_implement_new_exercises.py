"""The exercises of chapters 03, 07, 17 (paged read), 18 (chunk mask), 21, 23 (layer forward) and
24: a learner-style solution passes, each classic mistake fails the case written to catch it
(with its hint printed), and a stub is "not attempted"."""
import numpy as np
import pytest

from tinydecoder.core.ops import silu
from tinydecoder.course.implement import check_implementation, exercises


# -- 03: the pre-norm block ---------------------------------------------------------------------
def block(x, attn_norm, attention, ffn_norm, mlp):
    x = x + attention(attn_norm(x))
    return x + mlp(ffn_norm(x))


def block_post_norm(x, attn_norm, attention, ffn_norm, mlp):
    x = attn_norm(x + attention(x))
    return ffn_norm(x + mlp(x))


def block_no_attention_residual(x, attn_norm, attention, ffn_norm, mlp):
    x = attention(attn_norm(x))
    return x + mlp(ffn_norm(x))


def block_no_mlp_residual(x, attn_norm, attention, ffn_norm, mlp):
    x = x + attention(attn_norm(x))
    return mlp(ffn_norm(x))


def block_normalised_stream(x, attn_norm, attention, ffn_norm, mlp):
    x = attn_norm(x)
    x = x + attention(x)
    x = ffn_norm(x)
    return x + mlp(x)


# -- 07: the cached loop ------------------------------------------------------------------------
def loop(step, prompt, max_new_tokens, *, refeed=False, pos="right", n_calls=0, n_out=0):
    tokens, new, fed = list(prompt), [], 0
    for i in range(max_new_tokens + n_calls):
        rows = tokens if refeed else tokens[fed:]
        start = {"right": fed, "zero": 0, "one_late": fed + (i > 0)}[pos]
        logits = step(rows, np.arange(start, start + len(rows)))
        fed += len(rows)
        token = int(np.argmax(logits[-1]))
        tokens.append(token)
        new.append(token)
    return new[:max_new_tokens + n_out]


# -- 17: the paged read -------------------------------------------------------------------------
def paged(q, pool_k, pool_v, block_table, length, *, clip=True, physical=True):
    Hq, d = q.shape
    B, Hkv = pool_k.shape[1], pool_k.shape[2]
    ks, vs = [], []
    for i in range(-(-length // B)):
        b = block_table[i] if physical else i
        n = min(B, length - i * B) if clip else B
        ks.append(pool_k[b, :n])
        vs.append(pool_v[b, :n])
    k, v = np.concatenate(ks), np.concatenate(vs)  # [T, Hkv, d]
    out = np.empty_like(q)
    for h in range(Hq):
        s = k[:, h // (Hq // Hkv)] @ q[h] / np.sqrt(d)
        w = np.exp(s - s.max())
        out[h] = (w / w.sum()) @ v[:, h // (Hq // Hkv)]
    return out


# -- 18: the chunk mask -------------------------------------------------------------------------
def chunk_mask(start, n_tokens, *, relative=False):
    q_pos = np.arange(n_tokens) + (0 if relative else start)
    k_pos = np.arange(start + n_tokens)
    return np.where(k_pos[None, :] <= q_pos[:, None], 0.0, -np.inf)


def chunk_mask_large_negative(start, n_tokens):
    return np.maximum(chunk_mask(start, n_tokens), -1e4)


# -- 21: tensor parallel ------------------------------------------------------------------------
def tp(x, w_gate, w_up, w_down, b_down, n_shards, all_reduce, *, mistake=None):
    F, D = w_down.shape
    size = F // n_shards
    parts = []
    if mistake == "wrong axis":  # rows of gate/up (with x's columns), columns of down, gathered
        dsize = D // n_shards
        cols = [slice(r * dsize, (r + 1) * dsize) for r in range(n_shards)]
        outs = [(silu(x[:, c] @ w_gate[c]) * (x[:, c] @ w_up[c])) @ w_down[:, c] for c in cols]
        y = np.concatenate(outs, axis=1)
        return y if b_down is None else y + b_down
    hs = [silu(x @ w_gate[:, r * size:(r + 1) * size]) * (x @ w_up[:, r * size:(r + 1) * size])
          for r in range(n_shards)]
    if mistake == "reduce after column":  # all-reduce the column-parallel outputs (zero-padded)
        full = all_reduce([np.pad(h, ((0, 0), (r * size, F - (r + 1) * size))) for r, h in enumerate(hs)])
        hs = [full[:, r * size:(r + 1) * size] for r in range(n_shards)]
    for r, h in enumerate(hs):
        part = h @ w_down[r * size:(r + 1) * size]
        if mistake == "bias on every shard" and b_down is not None:
            part = part + b_down
        parts.append(part)
    y = all_reduce(parts)
    return y if b_down is None or mistake == "bias on every shard" else y + b_down


# -- 23: the MoE layer --------------------------------------------------------------------------
def moe(x, router_logits, experts, k, *, mistake=None):
    z = router_logits - router_logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    if mistake == "softmax over all experts":  # every expert, weighted by its probability
        return sum(p[:, [e]].astype(x.dtype) * expert(x) for e, expert in enumerate(experts))
    chosen = np.argsort(-p, axis=1, kind="stable")[:, :k]
    gates = np.take_along_axis(p, chosen, axis=1)
    if mistake != "no renormalisation":
        gates = gates / gates.sum(axis=1, keepdims=True)
    y, pieces = np.zeros_like(x), []
    for e, expert in enumerate(experts):
        rows, slots = np.nonzero(chosen == e)
        if rows.size:
            out = gates[rows, slots, None].astype(x.dtype) * expert(x[rows])
            if mistake == "wrong order":
                pieces.append(out)
            else:
                y[rows] += out
    if mistake == "wrong order":  # outputs concatenated expert by expert, read back as token-major
        return np.concatenate(pieces).reshape(len(x), k, -1).sum(axis=1)
    return y


# -- 24: the bitmask ----------------------------------------------------------------------------
def bitmask(logits, mask, eos_id, accepting, *, order="lsb", fill=-np.inf, eos_rule=True):
    V = len(logits)
    t = np.arange(V)
    words = np.asarray(mask).view(np.uint32).astype(np.int64)
    bit = t % 32 if order == "lsb" else 31 - t % 32
    allowed = ((words[t // 32] >> bit) & 1).astype(bool)
    if eos_rule:
        allowed[eos_id] = accepting
    return np.where(allowed, logits, fill)


SOLUTIONS = {
    "pre_norm_block": block,
    "cached_greedy": loop,
    "paged_decode_attention": paged,
    "chunk_mask": chunk_mask,
    "tensor_parallel_swiglu": tp,
    "moe_forward": moe,
    "apply_token_bitmask": bitmask,
}

WRONG = [  # (exercise, wrong function, the case meant to catch it)
    ("pre_norm_block", block_post_norm, "the sublayers read normalised rows"),
    ("pre_norm_block", block_post_norm, "a large stream keeps its size"),
    ("pre_norm_block", block_no_attention_residual, "sublayers that add nothing"),
    ("pre_norm_block", block_no_attention_residual, "the mlp reads the stream after attention"),
    ("pre_norm_block", block_no_mlp_residual, "sublayers that add nothing"),
    ("pre_norm_block", block_normalised_stream, "sublayers that add nothing"),
    ("pre_norm_block", block_normalised_stream, "a large stream keeps its size"),
    ("cached_greedy", lambda s, p, n: loop(s, p, n, refeed=True), "one new token per later step"),
    ("cached_greedy", lambda s, p, n: loop(s, p, n, pos="zero"), "positions continue after the prompt"),
    ("cached_greedy", lambda s, p, n: loop(s, p, n, pos="one_late"), "positions continue after the prompt"),
    ("cached_greedy", lambda s, p, n: loop(s, p, n, n_calls=1), "n forward calls for n tokens"),
    ("cached_greedy", lambda s, p, n: loop(s, p, n, n_out=-1), "max_new_tokens tokens come back"),
    ("paged_decode_attention", lambda *a: paged(*a, clip=False), "a partly filled last block"),
    ("paged_decode_attention", lambda *a: paged(*a, physical=False), "a shuffled block table"),
    ("chunk_mask", lambda s, n: chunk_mask(s, n, relative=True), "a chunk after cached positions"),
    ("chunk_mask", lambda s, n: chunk_mask(s, n, relative=True), "a decode step (one query)"),
    ("chunk_mask", chunk_mask_large_negative, "hidden keys are -inf, visible ones 0"),
    ("tensor_parallel_swiglu", lambda *a: tp(*a, mistake="wrong axis"), "square weights (D = F), 3 shards"),
    ("tensor_parallel_swiglu", lambda *a: tp(*a, mistake="wrong axis"), "one all-reduce, of [T, D] partial sums"),
    ("tensor_parallel_swiglu", lambda *a: tp(*a, mistake="reduce after column"),
     "one all-reduce, of [T, D] partial sums"),
    ("tensor_parallel_swiglu", lambda *a: tp(*a, mistake="bias on every shard"), "the bias is added once"),
    ("moe_forward", lambda *a: moe(*a, mistake="softmax over all experts"), "only the chosen experts count"),
    ("moe_forward", lambda *a: moe(*a, mistake="no renormalisation"), "the gates sum to 1"),
    ("moe_forward", lambda *a: moe(*a, mistake="wrong order"), "each token's output in its own row"),
    ("apply_token_bitmask", lambda *a: bitmask(*a, order="msb"), "bit order in a word"),
    ("apply_token_bitmask", lambda *a: bitmask(*a, fill=0.0), "forbidden tokens get -inf"),
    ("apply_token_bitmask", lambda *a: bitmask(*a, eos_rule=False), "no end token before the grammar accepts"),
]


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_learner_style_solution_passes(name, capsys):
    report = check_implementation(name, SOLUTIONS[name])
    assert report.passed, capsys.readouterr().out


@pytest.mark.parametrize("name, wrong, case", WRONG, ids=[f"{n}: {c}" for n, _, c in WRONG])
def test_wrong_version_fails_its_case(name, wrong, case, capsys):
    assert case in {c.name for c in exercises()[name]}
    report = check_implementation(name, wrong)
    out = capsys.readouterr().out
    assert report.status == "failed" and case in report.failed, out
    hint = next(c.hint for c in exercises()[name] if c.name == case)
    assert f"FAIL {case}: {hint}" in out and "[[" not in out and "array(" not in out


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_a_stub_is_not_attempted(name, capsys):
    def stub(*args, **kwargs):
        raise NotImplementedError

    assert check_implementation(name, stub).status == "not attempted"
    assert capsys.readouterr().out.startswith(f"NOT ATTEMPTED {name}")
