"""core/fused.py: a decoder block over a few rows of one sequence in one compiled call. It runs
the kernels `fast._block` runs, in the same order, so its logits and the K/V it caches must equal
the unfused fast path's up to the last bits of float32 (LLVM may vectorise a kernel inlined into
the block, such as the norm's sum, in another order: differences of 1e-7 were seen on these toy
shapes, none on SmolLM2's), and the reference path's up to float32 rounding. Checked on float32
models whose weights are not shared with the reference side, for 1-8 new rows (the products in
skinny's sweeps up to SWEEPS_UP_TO_ROWS, in tiles.py's 8-row tile above), after 0, 7 and 130
cached positions (a cache that must grow on the way), both RoPE layouts, grouped and one-KV-head
attention, head sizes that are and are not multiples of 8 (the attention kernel's two loops); and
that every other pass (more rows, a batch, another cache, float64, no RoPE, weights the sweeps do
not take) runs `fast._block` and is still right."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core import reference
from tinydecoder.core.model import LayerWeights, Model
from tinydecoder.core.toy import random_model
from tinydecoder.fast import forward_pass as fast
from tinydecoder.fast import fused, tunables
from tinydecoder.fast.compiled import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="numba is not installed (the [fast] extra)")


def config(n_heads=6, n_kv_heads=2, head_dim=8, layout="halves", position="rope"):
    return td.Config(vocab_size=61, d_model=24, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
                     n_layers=3, d_ff=40, max_context=200, position=position, norm_eps=1e-5, rope_layout=layout,
                     tied_embeddings=True, name="fused-test")


CONFIGS = {"gqa": config(), "gqa-interleaved": config(layout="interleaved"), "one-kv-head-d12": config(6, 1, 12),
           "mha-d16": config(4, 4, 16)}


def pair(cfg, seed=5):
    """(float64 reference model, float32 fast model with out-major matrices; no array shared)."""
    ref = random_model(cfg, seed=seed, dtype=np.float64)

    def f32(a):
        return None if a is None else np.asfortranarray(a, np.float32) if a.ndim == 2 else a.astype(np.float32)

    layers = [LayerWeights(**{k: f32(v) for k, v in layer.arrays().items()}) for layer in ref.layers]
    mine = Model(ref.config, embed=np.ascontiguousarray(ref.embed, np.float32), layers=layers,
                 final_norm=f32(ref.final_norm), pos_table=f32(ref.pos_table), lm_head=None)
    return ref, mine


@pytest.fixture
def layers_run(monkeypatch, fused_layers_of):
    """Every matrix goes to numba's products (the toy matrices are below SKINNY_MIN_WEIGHTS); the
    list collects the rows of each layer fused.run_layers ran (all of them in one call)."""
    monkeypatch.setattr(tunables, "SKINNY_MIN_WEIGHTS", 0)
    return fused_layers_of(fused)


def unfused(monkeypatch):
    monkeypatch.setattr(fused, "applies", lambda *a: False)


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 61, n).tolist()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("past", [0, 7, 130])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 8])
def test_a_fused_pass_equals_the_unfused_kernels(name, past, rows, layers_run, monkeypatch):
    _, mine = pair(CONFIGS[name])
    ids = tokens(past + rows, seed=past + rows)
    caches = [mine.new_cache(past + 1), mine.new_cache(past + 1)]  # each grows when the new rows come
    for cache in caches:
        if past:
            fast.forward(mine, ids[:past], cache, last_only=True)
    layers_run.clear()
    got = fast.forward(mine, ids[past:], caches[0])
    assert layers_run == [rows] * mine.config.n_layers  # every layer ran fused
    with monkeypatch.context() as m:
        unfused(m)
        want = fast.forward(mine, ids[past:], caches[1])
    assert len(layers_run) == mine.config.n_layers  # the unfused pass did not
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert len(caches[0]) == len(caches[1]) == past + rows
    for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        assert np.array_equal(a[:past], b[:past])  # the rows before the pass are untouched
        np.testing.assert_allclose(a[past:past + rows], b[past:past + rows], rtol=0, atol=1e-5 * np.abs(b).max())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_decode_and_checks_equal_the_reference(name, layers_run):
    """A prefill, then checks of 1-7 guesses and decode steps, every layer of the few-row
    passes fused; the last-only passes fuse every layer but the last (it keeps one row)."""
    ref, mine = pair(CONFIGS[name])
    ids = tokens(80, seed=1)
    want = reference.forward(ref, ids)
    cache = mine.new_cache(8)
    np.testing.assert_allclose(fast.forward(mine, ids[:40], cache), want[:40], rtol=0, atol=2e-4 * np.abs(want).max())
    at = 40
    for n, last_only in ((5, False), (3, False), (1, True), (8, False), (1, True), (4, True), (7, True), (2, False)):
        layers_run.clear()
        got = fast.forward(mine, ids[at:at + n], cache, last_only=last_only)
        np.testing.assert_allclose(got, want[at + n - 1:at + n] if last_only else want[at:at + n], rtol=0,
                                   atol=2e-4 * np.abs(want).max())
        fused_layers = mine.config.n_layers - (last_only and n > 1)  # the kept row's last layer: fast._block
        assert layers_run == [n] * fused_layers
        at += n
    assert len(cache) == at


def test_a_last_only_pass_over_a_few_rows_runs_the_head_on_the_kept_row_only(layers_run, monkeypatch):
    """A short prompt with last_only: every layer but the last fused, the last keeps one row, and
    the final norm and the head see that row alone (not the pass's scratch of every row)."""
    ref, mine = pair(CONFIGS["gqa"])
    ids = tokens(5, seed=6)
    heads, real = [], fast.project
    monkeypatch.setattr(fast, "project", lambda h, w, out, *a: (heads.append(h.shape[0]) if w is mine.lm_head else None)
                        or real(h, w, out, *a))
    got = fast.forward(mine, ids, mine.new_cache(8), last_only=True)
    assert layers_run == [5] * (mine.config.n_layers - 1) and heads == [1]
    want = reference.forward(ref, ids)[-1:]
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_other_passes_run_the_unfused_block_and_stay_right(layers_run):
    ref, mine = pair(CONFIGS["gqa"])
    ids = tokens(20, seed=2)
    want = reference.forward(ref, ids)

    def check(got, rows):
        np.testing.assert_allclose(got, want[rows], rtol=0, atol=2e-4 * np.abs(want).max())

    check(fast.forward(mine, ids[:9]), slice(0, 9))  # 9 rows: more than ATTEND_ROWS_UP_TO
    caches = [mine.new_cache(20), mine.new_cache(20)]
    fast.forward_batch(mine, [ids[:3], ids[:3]], caches)  # two sequences in one pass
    stacked = fast.BatchKVCache.stack(caches, extra=1)
    for got in fast.forward_batch(mine, [ids[3:4], ids[3:4]], stacked, last_only=True):  # a batched cache
        check(got, slice(3, 4))
    fast.forward(mine, ids[:3], td.QuantizedKVCache(mine.config, group_size=8))  # a cache of another kind
    assert layers_run == []
    C_ordered = Model(mine.config, embed=mine.embed, final_norm=mine.final_norm, pos_table=None, lm_head=None,
                      layers=[LayerWeights(**{k: np.ascontiguousarray(v) for k, v in layer.arrays().items()})
                              for layer in mine.layers])
    check(fast.forward(C_ordered, ids[:2]), slice(0, 2))  # weights the sweeps do not take
    assert layers_run == []
    cfg = mine.config
    assert not fused.applies(random_model(cfg, dtype=np.float64), mine.new_cache(4), 1)
    table = td.Config(**{**cfg.to_dict(), "position": "table"})
    assert not fused.applies(random_model(table), random_model(table).new_cache(4), 1)
    assert fused.applies(mine, mine.new_cache(4), tunables.ATTEND_ROWS_UP_TO)
    assert not fused.applies(mine, mine.new_cache(4), tunables.ATTEND_ROWS_UP_TO + 1)


def test_reserve_holds_rows_for_the_caller_and_grows():
    cfg = CONFIGS["gqa"]
    cache = td.KVCache(cfg, np.float32, capacity=2)
    k, v, start = cache.reserve(0, 3)  # past the capacity: doubles
    assert start == 0 and k.shape == v.shape == (4, cfg.n_kv_heads, cfg.head_dim) and cache.lengths[0] == 3
    k[:3] = 1.0
    k2, _, start = cache.reserve(0, 1)
    assert start == 3 and k2 is k and cache.lengths[0] == 4  # room left: the same arrays
    k3, _, start = cache.reserve(0, 2)
    assert start == 4 and k3.shape[0] == 8 and np.all(k3[:3] == 1.0)  # doubled again, the rows kept
    with pytest.raises(ValueError, match="201 positions do not fit the context of 200"):
        cache.reserve(1, 201)
    assert cache.lengths[1] == 0


def test_passes_of_one_shape_reuse_their_scratch_and_agree(layers_run):
    """reused_scratch: one set of work arrays per shape and thread; a pass leaves nothing in them that
    the next one reads (the same steps from the same cache give the same logits, whatever ran between)."""
    ref, model = pair(CONFIGS["gqa"])
    first = fused.reused_scratch(model, 3, 50)
    assert fused.reused_scratch(model, 3, 90) is first  # the same shape (attention's tasks: as many)
    assert fused.reused_scratch(model, 5, 50) is not first and fused.reused_scratch(model, 3, 1) is not first
    import threading

    other = []
    thread = threading.Thread(target=lambda: other.append(fused.reused_scratch(model, 3, 50)))
    thread.start()
    thread.join()
    assert other[0] is not first  # each thread its own
    cache = model.new_cache(60)
    fast.forward(model, tokens(20, seed=3), cache)
    steps = [fast.forward(model, tokens(3, seed=s), cache.copy(3)) for s in (1, 2, 1)]
    fast.forward(model, tokens(5, seed=9), cache.copy(5))  # another shape in between
    again = fast.forward(model, tokens(3, seed=1), cache.copy(3))
    assert layers_run and np.array_equal(steps[0], steps[2]) and np.array_equal(steps[0], again)
    assert not np.array_equal(steps[0], steps[1])


def test_the_layers_blocks_are_kept_and_made_again_when_a_weight_changes(layers_run, monkeypatch):
    """run_layers' typed lists (`stacks`) are made once per model and cache, and made again when a
    layer's weight is replaced or the cache grows: the passes after either are still right."""
    from tinydecoder.fast import stacks

    _, mine = pair(CONFIGS["gqa"])
    ids = tokens(12, seed=8)
    cache = mine.new_cache(9)
    fast.forward(mine, ids[:8], cache)
    first = stacks.blocks(mine, "float32", fused._block_of)
    lists = stacks.layer_rows(cache, 0, 3)[:2]
    fast.forward(mine, ids[8:9], cache)  # fits the capacity of 9: the same arrays
    assert stacks.blocks(mine, "float32", fused._block_of) is first and stacks.layer_rows(cache, 0, 3)[:2] == lists
    mine.layers[1].wo = np.asfortranarray(mine.layers[1].wo * 2)  # a new matrix for layer 1
    unfused_cache = cache.copy()
    layers_run.clear()
    got = fast.forward(mine, ids[9:11], cache)  # past the capacity: the cache grows
    assert layers_run == [2] * 3 and stacks.blocks(mine, "float32", fused._block_of) is not first
    assert stacks.layer_rows(cache, 0, 3)[0][0] is cache.k[0] is not lists[0][0]
    with monkeypatch.context() as m:
        m.setattr(fused, "run_layers", lambda *a: 0)  # each layer by fast._block, with the new matrix
        want = fast.forward(mine, ids[9:11], unfused_cache)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("block", [8, 16, 3])
def test_a_paged_sequence_runs_fused_with_a_kvcaches_numbers(name, block, layers_run, monkeypatch):
    """A paged sequence (a server's cache) whose blocks hold a multiple of 8 positions runs every
    few-row pass fused, its K and V written into the pool's blocks and read where they lie (no
    gather): logits and stored rows equal a KVCache's bit for bit, through a prefill, decode
    steps, checks of a few guesses, a copy-on-write fork and blocks scattered by another sequence
    taking blocks in between. Other block sizes run fast._block (the pool's append), with the
    numbers of a KVCache's pass through fast._block."""
    from tinydecoder.serving.paged import PagedKVPool

    _, mine = pair(CONFIGS[name])
    pool = PagedKVPool.for_model(mine, 64, block)
    seq, other, cache = pool.new_sequence(), pool.new_sequence(), mine.new_cache(8)
    ids = tokens(60, seed=block)
    np.testing.assert_array_equal(fast.forward(mine, ids[:11], seq), fast.forward(mine, ids[:11], cache))
    at, fused_passes = 11, 0
    for n in (1, 3, 1, 8, 2, 1, 5, 1, 1, 4):
        fast.forward(mine, ids[:n + 2], other)  # another sequence takes blocks between ours
        layers_run.clear()
        got = fast.forward(mine, ids[at:at + n], seq)
        fused_passes += layers_run == [n] * mine.config.n_layers
        with monkeypatch.context() as m:
            if block % 8:  # the paged pass ran fast._block: so does the KVCache's (fused, the last bits may move)
                unfused(m)
            np.testing.assert_array_equal(got, fast.forward(mine, ids[at:at + n], cache))
        at += n
        if at > 30 and seq.n_blocks and len(seq.shared_blocks()) == 0:
            fork = seq.fork()  # the next pass copies the shared last block first
            forked = fast.forward(mine, ids[at:at + 1], fork)
            with monkeypatch.context() as m:
                if block % 8:
                    unfused(m)
                np.testing.assert_array_equal(forked, fast.forward(mine, ids[at:at + 1], cache.copy(1)))
            fork.release()
    assert fused_passes == (10 if block % 8 == 0 else 0)
    assert len(seq) == len(cache) == at and sorted(seq.block_table) != list(range(seq.n_blocks))
    empty = np.zeros((0, mine.config.n_kv_heads, mine.config.head_dim), np.float32)
    for layer in range(mine.config.n_layers):
        k, v = seq.append(layer, empty, empty)
        assert np.array_equal(k, cache.k[layer][:at]) and np.array_equal(v, cache.v[layer][:at])
    assert fused.applies(mine, seq, 1) == (block % 8 == 0)


@pytest.mark.parametrize("block", [16, 4])
def test_several_paged_sequences_in_one_pass_read_their_blocks_in_place(block, layers_run, monkeypatch):
    """A server's batch of decoding requests: forward_batch over several paged sequences of one pool.
    Their new rows attend to K and V where the blocks lie (no `append`, no gather) when the blocks
    hold a multiple of 8 positions, and every sequence's logits equal its own KVCache's bit for
    bit: few rows each in one compiled call for all of them (compiled.paged_attention), a prefill of
    11 rows or a chunk beside decodes one after another (prefill_attention reading the blocks).
    Blocks of 4 gather, with the same numbers."""
    from tinydecoder.serving.paged import PagedKVPool

    _, mine = pair(CONFIGS["gqa"])
    pool = PagedKVPool.for_model(mine, 96, block)
    seqs = [pool.new_sequence() for _ in range(3)]
    caches = [mine.new_cache(4) for _ in range(3)]
    ids = [tokens(40, seed=s) for s in range(3)]
    appends = []
    real = pool.append
    monkeypatch.setattr(pool, "append", lambda *a: appends.append(a[2].shape[0]) or real(*a))
    for lo, hi in ((0, 11), (11, 12), (12, 15), (15, 16), (16, 17)):  # a prefill of 11 rows, then few-row passes
        appends.clear()
        got = fast.forward_batch(mine, [t[lo:hi] for t in ids], seqs)
        want = fast.forward_batch(mine, [t[lo:hi] for t in ids], caches)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        assert len(appends) == (3 * mine.config.n_layers if block % 8 else 0)
    appends.clear()  # an engine step mixing a prefill chunk with decodes: one after another, none gathers
    got = fast.forward_batch(mine, [ids[0][17:29], ids[1][17:18], ids[2][17:19]], seqs, last_only=True)
    for g, w in zip(got, fast.forward_batch(mine, [ids[0][17:29], ids[1][17:18], ids[2][17:19]], caches, last_only=True)):
        np.testing.assert_array_equal(g, w)
    assert len(appends) == (3 * mine.config.n_layers if block % 8 else 0)
    assert layers_run == []  # several sequences: never the fused single-sequence layer
    assert [len(s) for s in seqs] == [29, 18, 19]
