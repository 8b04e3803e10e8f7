"""The core library: the seed's toy decoder reproduced, cache == recompute, GQA, causality,
dtype discipline, and a clear error for every bad input."""
import json
import math
import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tinydecoder as td
from tinydecoder.cli import main as cli_main


# ---------------------------------------------------------------- an independent reference
def reference_seed_logits(tokens):
    """the worked example's decoder in plain Python floats, written from its description (not from our
    library): returns the last position's logits for a full-context pass over `tokens`."""
    rng = random.Random(7)
    draw = lambda r, c: [[rng.uniform(-0.2, 0.2) for _ in range(c)] for _ in range(r)]
    emb, pos = draw(6, 8), draw(64, 8)
    blocks = [[draw(8, 8), draw(8, 4), draw(8, 4), draw(8, 8), draw(8, 16), draw(8, 16), draw(16, 8)]
              for _ in range(2)]
    head = draw(8, 6)
    mul = lambda row, w: [sum(row[i] * w[i][j] for i in range(len(row))) for j in range(len(w[0]))]
    norm = lambda row: [x / math.sqrt(sum(y * y for y in row) / len(row) + 1e-6) for x in row]
    xs = [[e + p for e, p in zip(emb[t], pos[i])] for i, t in enumerate(tokens)]
    for wq, wk, wv, wo, wg, wu, wd in blocks:
        hs = [norm(x) for x in xs]
        qs, ks, vs = [mul(h, wq) for h in hs], [mul(h, wk) for h in hs], [mul(h, wv) for h in hs]
        new = []
        for i, x in enumerate(xs):
            heads = []
            for h in range(2):  # both query heads read the single KV head
                q = qs[i][4 * h:4 * h + 4]
                s = [sum(a * b for a, b in zip(q, ks[j])) / 2.0 for j in range(i + 1)]
                m = max(s)
                e = [math.exp(v - m) for v in s]
                p = [v / sum(e) for v in e]
                heads += [sum(p[j] * vs[j][c] for j in range(i + 1)) for c in range(4)]
            x = [a + b for a, b in zip(x, mul(heads, wo))]
            z = norm(x)
            g, u = mul(z, wg), mul(z, wu)
            hidden = [gi / (1 + math.exp(-gi)) * ui for gi, ui in zip(g, u)]
            new.append([a + b for a, b in zip(x, mul(hidden, wd))])
        xs = new
    return mul(norm(xs[-1]), head)


@pytest.fixture(scope="module")
def toy():
    return td.toy_model()


def small_config(**overrides):
    base = dict(vocab_size=37, d_model=24, n_heads=6, n_kv_heads=2, head_dim=4, n_layers=3, d_ff=40,
                max_context=48, position="rope", rope_base=100.0, norm_scale=True, tied_embeddings=True)
    base.update(overrides)
    return td.Config(**base)


# ---------------------------------------------------------------- the seed's numbers
def test_seed_generation_and_work_counts(toy):
    full = td.generate(toy, td.SEED_PROMPT, 4, use_cache=False)
    cached = td.generate(toy, td.SEED_PROMPT, 4, use_cache=True)
    assert full.tokens == cached.tokens == [0, 1, 2, 3, 3, 2, 0, 4]
    assert (full.projected_rows, cached.projected_rows) == (44, 14)
    assert (full.score_pairs, cached.score_pairs) == (296, 112)
    assert [(e.step, e.phase, e.input_rows, e.context_tokens, e.next_token) for e in cached.events] == [
        (1, "prefill", 4, 4, 3), (2, "decode", 1, 5, 2), (3, "decode", 1, 6, 0), (4, "decode", 1, 7, 4)]
    assert [e.input_rows for e in full.events] == [4, 5, 6, 7]


def test_seed_five_tokens(toy):
    full = td.generate(toy, td.SEED_PROMPT, 5, use_cache=False)
    cached = td.generate(toy, td.SEED_PROMPT, 5, use_cache=True)
    assert (full.projected_rows, cached.projected_rows) == (60, 16)
    assert full.tokens == cached.tokens


def test_seed_logits_match_independent_reference_every_step(toy):
    cached = td.generate(toy, td.SEED_PROMPT, 4, use_cache=True)
    for event in cached.events:
        context = cached.tokens[:event.context_tokens]
        expected = reference_seed_logits(context)
        assert np.max(np.abs(event.logits - np.array(expected))) <= 1e-9
        assert event.next_token == int(np.argmax(expected))


def test_work_counts_match_the_trace(toy):
    cache = toy.new_cache()
    for new in ([0, 1, 2, 3], [3], [2]):
        past = len(cache)
        trace = td.Trace()
        td.forward(toy, new, cache, trace=trace)
        rows, pairs = td.work_counts(toy.config, past, len(new))
        assert rows == sum(r.inputs[0][0] for r in trace.select(op="k_proj"))
        d, Hq = toy.config.head_dim, toy.config.n_heads
        # score pairs count the causal (visible) pairs: the nonzero attention weights
        assert pairs == sum(np.count_nonzero(w) for w in trace.attention_weights.values())
        # the FLOP count is the full-rectangle matmul count, 4*Hq*S*T*d per layer (the worked example's formula)
        T = past + len(new)
        assert trace.total_flops(op="attention") == toy.config.n_layers * 4 * Hq * len(new) * T * d
        for (_layer, _), w in trace.attention_weights.items():
            assert w.shape == (Hq, len(new), T)


# ---------------------------------------------------------------- attention by hand
def test_hand_computed_attention():
    q = np.array([[[1.0, 0.0]]])  # [S=1, Hq=1, d=2]
    k = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # [T=2, Hkv=1, d=2]
    v = np.array([[[10.0, 0.0]], [[0.0, 20.0]]])
    out = td.attention(q, k, v)
    assert np.allclose(out[0], [6.69762, 6.60477], atol=5e-6)
    only_first = td.attention(q, k[:1], v[:1])
    assert np.allclose(only_first[0], [10.0, 0.0])


def test_mask_goes_in_before_softmax():
    scores = np.array([[0.5, 2.0], [1.0, -1.0]])
    right = td.softmax(scores + td.causal_mask(2, 2, np.float64))
    wrong = td.softmax(scores) * (td.causal_mask(2, 2, np.float64) == 0)
    assert np.allclose(right.sum(-1), 1.0)
    assert right[0, 0] == 1.0 and wrong[0, 0] < 0.2


def test_causal_mask_shapes():
    m = td.causal_mask(2, 5)
    assert m.shape == (2, 5)
    assert np.array_equal(np.isinf(m), [[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]])


def test_softmax_is_stable():
    x = np.array([1000.0, 1001.0, -np.inf], dtype=np.float32)
    p = td.softmax(x)
    assert np.all(np.isfinite(p)) and p[2] == 0 and abs(p.sum() - 1) < 1e-6


# ---------------------------------------------------------------- cache == recompute, GQA, causality
@settings(max_examples=25, deadline=None)
@given(st.data())
def test_cached_equals_recompute_random_splits(data):
    cfg = small_config(position=data.draw(st.sampled_from(["rope", "table"])))
    model = td.random_model(cfg, seed=data.draw(st.integers(0, 3)), dtype=np.float64)
    tokens = data.draw(st.lists(st.integers(0, cfg.vocab_size - 1), min_size=2, max_size=20))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(tokens) - 1), max_size=4))))
    cache = model.new_cache(capacity=1)
    pieces = [tokens[a:b] for a, b in zip([0] + cuts, cuts + [len(tokens)])]
    got = np.concatenate([td.forward(model, piece, cache) for piece in pieces])
    want = td.forward(model, tokens)
    assert np.max(np.abs(got - want)) < 1e-10
    assert len(cache) == len(tokens)


def test_generate_with_and_without_cache_agree_float32():
    cfg = small_config()
    model = td.random_model(cfg, seed=5, dtype=np.float32)
    a = td.generate(model, [1, 2, 3, 4, 5], 12, use_cache=True)
    b = td.generate(model, [1, 2, 3, 4, 5], 12, use_cache=False)
    assert a.tokens == b.tokens
    for ea, eb in zip(a.events, b.events):
        assert np.max(np.abs(ea.logits - eb.logits)) < 1e-4


def test_generate_without_keeping_logits():
    """keep_logits=False: the same tokens and event counts, every event's logits None (a long
    run then holds only the weights and the cache), and to_dict says so."""
    model = td.random_model(small_config(), seed=5, dtype=np.float32)
    kept = td.generate(model, [1, 2, 3], 10)
    lean = td.generate(model, [1, 2, 3], 10, keep_logits=False)
    assert lean.tokens == kept.tokens and len(lean.events) == len(kept.events) == 10
    assert all(e.logits is None for e in lean.events) and all(e.logits.shape == (model.config.vocab_size,)
                                                              for e in kept.events)
    assert lean.events[0].to_dict()["logits"] is None and len(kept.events[0].to_dict()["logits"]) == 37


def test_gqa_equals_mha_with_repeated_kv():
    rng = np.random.default_rng(0)
    S, Hq, Hkv, d = 5, 6, 2, 8
    q = rng.standard_normal((S, Hq, d))
    k, v = rng.standard_normal((S, Hkv, d)), rng.standard_normal((S, Hkv, d))
    gqa, w = td.attention(q, k, v, return_weights=True)
    mha = td.attention(q, td.repeat_kv(k, Hq // Hkv), td.repeat_kv(v, Hq // Hkv))
    assert np.allclose(gqa, mha)
    # and head by head: query head h reads KV head h // 3
    for h in range(Hq):
        kv = h // (Hq // Hkv)
        single = td.attention(q[:, h:h + 1], k[:, kv:kv + 1], v[:, kv:kv + 1])
        assert np.allclose(gqa[:, h * d:(h + 1) * d], single)
    assert w.shape == (Hq, S, S)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(0, 36), min_size=1, max_size=12), st.lists(st.integers(0, 36), min_size=1, max_size=8))
def test_appending_tokens_never_changes_earlier_logits(prefix, suffix):
    model = td.random_model(small_config(), seed=2, dtype=np.float64)
    short = td.forward(model, prefix)
    long = td.forward(model, prefix + suffix)
    assert np.max(np.abs(long[:len(prefix)] - short)) < 1e-12


def test_last_only_matches_full_last_row():
    model = td.random_model(small_config(), seed=3, dtype=np.float64)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    assert np.allclose(td.forward(model, ids, last_only=True), td.forward(model, ids)[-1:], atol=1e-12)


def test_forward_batch_equals_separate_runs():
    model = td.random_model(small_config(), seed=4, dtype=np.float64)
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    caches = [model.new_cache() for _ in prompts]
    for c, p in zip(caches, prompts):  # give them different pasts
        td.forward(model, p, c)
    steps = [[10], [11, 12], [13]]
    batched = td.forward_batch(model, steps, caches)
    for p, s, got in zip(prompts, steps, batched):
        assert np.max(np.abs(got - td.forward(model, p + s)[len(p):])) < 1e-12


# ---------------------------------------------------------------- dtype discipline
def test_float32_in_float32_out():
    model = td.random_model(small_config(), seed=1, dtype=np.float32)
    cache = model.new_cache()
    trace = td.Trace()
    logits = td.forward(model, [1, 2, 3], cache, trace=trace)
    assert logits.dtype == np.float32
    assert cache.k[0].dtype == np.float32
    assert all(w.dtype == np.float32 for w in trace.attention_weights.values())
    assert td.forward(model, [4], cache).dtype == np.float32
    g = td.generate(model, [1, 2], 3)
    assert all(e.logits.dtype == np.float32 for e in g.events)


def test_ops_keep_float32():
    x = np.ones((3, 4, 8), np.float32)
    assert td.rmsnorm(x[:, 0], None, 1e-5).dtype == np.float32
    assert td.softmax(x).dtype == np.float32
    assert td.silu(x).dtype == np.float32
    assert td.apply_rope(x, np.arange(3), 10000.0).dtype == np.float32
    assert td.apply_rope(x, np.arange(3), 10000.0, "interleaved").dtype == np.float32
    assert td.attention(x, x[:, :2], x[:, :2]).dtype == np.float32


def test_float64_scalar_would_promote():
    """The trap the attention scale avoids: a numpy float64 scalar promotes float32 arrays."""
    q = np.ones((2, 2), np.float32)
    assert (q * np.float64(0.125)).dtype == np.float64
    assert (q * q.dtype.type(0.125)).dtype == np.float32


def test_toy_float64_and_float32_agree():
    a = td.forward(td.toy_model(), td.SEED_PROMPT)
    b = td.forward(td.toy_model(dtype=np.float32), td.SEED_PROMPT)
    assert a.dtype == np.float64 and b.dtype == np.float32
    assert np.max(np.abs(a - b)) < 1e-5


# ---------------------------------------------------------------- the KV cache
def test_cache_grows_geometrically_without_copying_each_step():
    model = td.random_model(small_config(max_context=2000, position="rope"), seed=0)
    cache = model.new_cache(capacity=1)
    seen = set()
    for t in range(300):
        td.forward(model, [t % 37], cache)
        seen.add(cache.capacity)
    assert len(cache) == 300
    assert len(seen) <= 10  # 1, 2, 4, ..., 512: a handful of reallocations, not 300
    assert cache.capacity >= 300
    assert cache.nbytes == 300 * model.config.kv_bytes_per_token(4)
    assert cache.allocated_nbytes >= cache.nbytes


def test_cache_nbytes_smollm2_shape():
    cfg = td.Config(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30,
                    d_ff=1536, max_context=8192, position="rope")
    assert cfg.kv_bytes_per_token(4) == 46080


def test_cache_of_another_config_is_refused(toy):
    other = td.random_model(small_config(), seed=0, dtype=np.float64)
    with pytest.raises(ValueError, match="another model"):
        td.forward(toy, [1], other.new_cache())


def test_cache_of_another_dtype_is_refused(toy):
    with pytest.raises(ValueError, match="float32"):
        td.forward(toy, [1], td.KVCache(toy.config, np.float32))


def test_mismatched_layer_lengths_raise(toy):
    cache = toy.new_cache()
    td.forward(toy, [0, 1, 2], cache)
    cache.lengths[1] = 2
    with pytest.raises(ValueError, match=r"per-layer lengths \[3, 2\] differ"):
        td.forward(toy, [3], cache)


def test_failed_call_leaves_cache_untouched(toy):
    cache = toy.new_cache()
    td.forward(toy, [0, 1], cache)
    with pytest.raises(ValueError):
        td.forward(toy, [1, 99], cache)
    assert len(cache) == 2


# ---------------------------------------------------------------- clear errors
@pytest.mark.parametrize("ids, error, message", [
    ([], ValueError, "empty prompt"),
    ([0, -1], ValueError, r"token id -1 at position 1 is out of range: ids must be in 0\.\.5"),
    ([6], ValueError, r"token id 6 at position 0 is out of range"),
    ([1.5], TypeError, "must be integers, got 1.5"),
    ([True], TypeError, "must be integers"),
    ("0123", TypeError, "got text"),
    ([[0, 1]], ValueError, "flat sequence"),
])
def test_bad_token_ids(toy, ids, error, message):
    with pytest.raises(error, match=message):
        td.forward(toy, ids)


def test_context_over_the_limit(toy):
    with pytest.raises(ValueError, match="context too long: 0 cached \\+ 65 new = 65 positions.*limit is 64"):
        td.forward(toy, [0] * 65)
    cache = toy.new_cache()
    td.forward(toy, [0] * 60, cache)
    with pytest.raises(ValueError, match="60 cached \\+ 5 new"):
        td.forward(toy, [0] * 5, cache)
    with pytest.raises(ValueError, match="needs 65 positions"):
        td.generate(toy, [0] * 60, 6)


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_generate_rejects_bad_new_token_count(toy, n):
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        td.generate(toy, [0], n)


@pytest.mark.parametrize("overrides, message", [
    (dict(n_heads=6, n_kv_heads=4), r"multiple of n_kv_heads \(4\).*Allowed n_kv_heads here: \[1, 2, 3, 6\]"),
    (dict(d_model=0), "d_model must be a positive integer"),
    (dict(position="alibi"), "position must be one of"),
    (dict(head_dim=5), "head_dim must be even"),
    (dict(rope_layout="zigzag"), "rope_layout must be one of"),
    (dict(norm_eps=0.0), "norm_eps must be > 0"),
])
def test_invalid_config(overrides, message):
    with pytest.raises(ValueError, match=message):
        small_config(**overrides)


def test_weights_of_wrong_shape_are_named():
    model = td.random_model(small_config(), seed=0)
    layers = list(model.layers)
    w = layers[1]
    layers[1] = td.LayerWeights.from_parts(w.wq, w.wk[:, :4], w.wv[:, :4], w.wo, w.w_gate, w.w_up, w.w_down,
                                           w.attn_norm, w.ffn_norm)  # K and V heads 4 columns short
    q_width = model.config.q_width
    with pytest.raises(ValueError, match=rf"layers\[1\]\.w_qkv has shape \(24, {q_width + 8}\).*needs \(24, {q_width + 16}\)"):
        td.Model(model.config, embed=model.embed, layers=layers, final_norm=model.final_norm)


# ---------------------------------------------------------------- the command line
def test_cli_seed_json(capsys):
    assert cli_main(["seed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"full_context", "with_cache"}
    for path, rows, pairs in (("full_context", 44, 296), ("with_cache", 14, 112)):
        run = out[path]
        assert run["tokens"] == [0, 1, 2, 3, 3, 2, 0, 4]
        assert (run["projected_rows"], run["score_pairs"]) == (rows, pairs)
        assert [e["next_token"] for e in run["events"]] == [3, 2, 0, 4]
        assert set(run["events"][0]) == {"step", "phase", "input_rows", "context_tokens", "next_token", "logits"}
    for event in out["with_cache"]["events"]:
        expected = reference_seed_logits(out["with_cache"]["tokens"][:event["context_tokens"]])
        assert max(abs(a - b) for a, b in zip(event["logits"], expected)) <= 1e-9


def test_cli_seed_table_and_five_tokens(capsys):
    assert cli_main(["seed", "--new-tokens", "5"]) == 0
    text = capsys.readouterr().out
    assert "[0,1,2,3,3,2,0,4,2]" in text
    assert "projected rows" in text and " 60 " in text.replace("\n", " ") and "16" in text


def test_cli_rejects_zero_new_tokens():
    run = subprocess.run([sys.executable, "-m", "tinydecoder", "seed", "--new-tokens", "0"],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert "--new-tokens: must be at least 1, got 0" in run.stderr
    assert "Traceback" not in run.stderr
