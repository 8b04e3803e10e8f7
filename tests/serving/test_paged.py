"""The paged KV cache: same logits as the contiguous cache, reclaim, fork + copy-on-write,
prefix reuse, clear errors."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinydecoder import Config, forward, forward_batch, generate, random_model, toy_model
from tinydecoder.serving.backends import PagedKV
from tinydecoder.serving.paged import PagedKVPool, PoolExhaustedError, block_hash, block_hashes

TOY = toy_model()  # float64, table positions, Hq=2, Hkv=1
ROPE_CFG = Config(vocab_size=11, d_model=16, n_heads=4, n_kv_heads=2, head_dim=8, n_layers=2, d_ff=24,
                  max_context=64, position="rope", norm_scale=True, name="rope-gqa")
ROPE = random_model(ROPE_CFG, seed=3, dtype=np.float32)
MODELS = {"toy64": (TOY, 1e-12), "rope32": (ROPE, 2e-5)}


def close(a, b, tol):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def split(n, cuts):
    """Chunk lengths summing to n from sorted cut points."""
    points = sorted({c for c in cuts if 0 < c < n})
    return [b - a for a, b in zip([0] + points, points + [n])]


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(sorted(MODELS)), block=st.sampled_from([1, 3, 16]), data=st.data())
def test_paged_logits_equal_contiguous(model, block, data):
    m, tol = MODELS[model]
    V = m.config.vocab_size
    tokens = data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=40))
    chunks = split(len(tokens), data.draw(st.lists(st.integers(1, 39), max_size=6)))
    pool = PagedKVPool.for_model(m, n_blocks=64, block_size=block)
    seq, ref = pool.new_sequence(), m.new_cache()
    pos = 0
    for n in chunks:  # a prefill in chunks, then decode-sized steps
        got, want = forward(m, tokens[pos:pos + n], seq), forward(m, tokens[pos:pos + n], ref)
        close(got, want, tol)
        pos += n
    assert len(seq) == len(ref) == len(tokens)
    assert seq.n_blocks == -(-len(tokens) // block)
    assert 0 <= seq.waste < block
    for layer in range(m.config.n_layers):  # the stored rows themselves
        k, v = seq.append(layer, np.zeros((0, m.config.n_kv_heads, m.config.head_dim), m.dtype),
                          np.zeros((0, m.config.n_kv_heads, m.config.head_dim), m.dtype))
        close(k, ref.k[layer][:len(ref)], 0)
        close(v, ref.v[layer][:len(ref)], 0)


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("block", [1, 3, 16])
def test_generate_with_paged_cache(model, block):
    m, tol = MODELS[model]
    prompt = [1, 2, 3, 4, 5, 0, 1]
    pool = PagedKVPool.for_model(m, 32, block)
    g_paged = generate(m, prompt, 6, cache=pool.new_sequence())
    g_ref = generate(m, prompt, 6)
    assert g_paged.tokens == g_ref.tokens
    for a, b in zip(g_paged.events, g_ref.events):
        close(a.logits, b.logits, tol)


def test_forward_batch_over_one_pool():
    m, tol = MODELS["rope32"]
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10, 1, 2, 3, 4, 5, 6]]
    pool = PagedKVPool.for_model(m, 32, 3)
    seqs = [pool.new_sequence() for _ in prompts]
    refs = [m.new_cache() for _ in prompts]
    for got, want in zip(forward_batch(m, prompts, seqs), forward_batch(m, prompts, refs)):
        close(got, want, tol)
    step = [[3], [4], [5]]
    for got, want in zip(forward_batch(m, step, seqs), forward_batch(m, step, refs)):
        close(got, want, tol)
    tables = [set(s.block_table) for s in seqs]
    assert not (tables[0] & tables[1]) and not (tables[1] & tables[2])  # no block in two tables
    assert pool.stats().blocks_used == 2 + 1 + 4


def test_reclaim_returns_blocks_to_the_free_list():
    pool = PagedKVPool.for_model(TOY, 10, 4)
    a, b = pool.new_sequence(), pool.new_sequence()
    forward(TOY, [0, 1, 2, 3, 4], a)  # 2 blocks
    forward(TOY, [5, 4, 3], b)  # 1 block
    s = pool.stats()
    assert (s.blocks_used, s.blocks_free, s.tokens, s.slots, s.waste) == (3, 7, 8, 12, 4)
    held = list(a.block_table)
    assert a.release() == 2
    assert pool.blocks_free == 9 and all(pool.refcount[h] == 0 for h in held)
    assert list(pool.free_list)[-2:] == held  # back on the free list
    assert a.release() == 0  # twice is a no-op
    with pytest.raises(ValueError, match="released"):
        forward(TOY, [1], a)
    c = pool.new_sequence()
    forward(TOY, list(range(6)) * 6, c)  # 36 positions = 9 blocks: needs the reclaimed ones
    assert pool.blocks_free == 0 and set(held) <= set(c.block_table)
    assert b.release() == 1 and c.release() == 9 and pool.blocks_free == 10


@pytest.mark.parametrize("block", [1, 3, 16])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_fork_copy_on_write_keeps_both_continuations_exact(model, block):
    m, tol = MODELS[model]
    prompt = [1, 2, 3, 4, 5, 0, 1, 2][:7]
    pool = PagedKVPool.for_model(m, 32, block)
    a = pool.new_sequence()
    forward(m, prompt, a)
    b = a.fork()
    assert b.block_table == a.block_table and a.shared_blocks() == list(range(a.n_blocks))
    used_before = pool.blocks_used
    partial = len(prompt) % block != 0
    logits_b = forward(m, [4], b)  # b writes first: copies the shared partial block, if any
    assert pool.copies == int(partial)
    assert pool.blocks_used == used_before + 1  # a copy, or a new block when the last was full
    logits_a = forward(m, [2], a)  # a then writes into its own (no longer shared) block
    assert pool.copies == int(partial)
    full = len(prompt) // block
    assert a.block_table[:full] == b.block_table[:full]  # full blocks still shared
    assert not set(a.block_table[full:]) & set(b.block_table[full:])
    ra, rb = m.new_cache(), m.new_cache()
    forward(m, prompt, ra), forward(m, prompt, rb)
    close(logits_a, forward(m, [2], ra), tol)
    close(logits_b, forward(m, [4], rb), tol)
    for _ in range(3):  # keep decoding both: still the separate runs
        close(forward(m, [3], a), forward(m, [3], ra), tol)
        close(forward(m, [0], b), forward(m, [0], rb), tol)
    b.release()
    assert all(pool.refcount[x] == 1 for x in a.block_table)


def test_fork_of_half_written_sequence_is_refused():
    pool = PagedKVPool.for_model(TOY, 8, 2)
    seq = pool.new_sequence()
    forward(TOY, [1, 2, 3], seq)
    seq.append(0, np.zeros((1, 1, 4)), np.zeros((1, 1, 4)))
    with pytest.raises(ValueError, match="inconsistent"):
        seq.fork()
    with pytest.raises(ValueError, match="inconsistent"):
        forward(TOY, [1], seq)
    seq.truncate(3)  # the repair
    close(forward(TOY, [4], seq), forward(TOY, [1, 2, 3, 4], None)[-1:], 1e-12)


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(sorted(MODELS)), block=st.sampled_from([1, 3, 16]), data=st.data())
def test_prefix_reuse_same_logits_and_exact_saving(model, block, data):
    m, tol = MODELS[model]
    V = m.config.vocab_size
    ids = st.lists(st.integers(0, V - 1), max_size=20)
    shared = data.draw(ids)
    first = shared + data.draw(ids)
    second = shared + data.draw(ids)
    if not first or not second:
        return
    pool = PagedKVPool.for_model(m, 64, block)
    a = pool.new_sequence(first)
    assert a.n_cached == 0 and a.pending_tokens == first
    forward(m, a.pending_tokens, a)
    b = pool.new_sequence(second)
    common = next((i for i, (x, y) in enumerate(zip(first, second)) if x != y), min(len(first), len(second)))
    expect = (min(common, len(first), len(second) - 1) // block) * block
    assert b.n_cached == expect  # the shared prefix rounded down to whole blocks
    assert len(b.pending_tokens) == len(second) - expect
    assert b.block_table == a.block_table[:expect // block]
    got = forward(m, b.pending_tokens, b)
    want = forward(m, second, None)[expect:]
    close(got, want, tol)
    close(forward(m, [1], b), forward(m, second + [1], None)[-1:], tol)
    assert pool.stats().prefix_hit_tokens == expect


def test_prefix_cache_survives_release_in_lru_and_is_evicted_last():
    prompt = [1, 2, 3, 4, 5, 0, 1, 2, 3]  # blocks of 4: two full blocks, one partial
    pool = PagedKVPool.for_model(TOY, 6, 4)
    a = pool.new_sequence(prompt)
    forward(TOY, a.pending_tokens, a)
    assert len(pool.prefix_index) == 2
    hashes = block_hashes(prompt, 4)
    assert [pool.prefix_index[h] for h in hashes] == a.block_table[:2]
    assert a.release() == 3
    s = pool.stats()
    assert (s.blocks_free, s.blocks_cached_free) == (6, 2)  # free, but still cached
    b = pool.new_sequence(prompt + [4])
    assert b.n_cached == 8 and b.block_table == pool.match_prefix(prompt)
    assert pool.stats().blocks_cached_free == 0
    b.release()
    c = pool.new_sequence()  # fresh blocks are taken before cached ones are evicted
    forward(TOY, [0] * 16, c)
    assert len(pool.prefix_index) == 2
    forward(TOY, [0] * 8, c)  # 24 positions = 6 blocks: both cached blocks evicted
    assert pool.prefix_index == {} and pool.match_prefix(prompt) == []


def test_without_freed_block_cache_release_forgets_prefixes():
    pool = PagedKVPool.for_model(TOY, 6, 2, cache_freed_blocks=False)
    a = pool.new_sequence([1, 2, 3, 4, 5])
    forward(TOY, a.pending_tokens, a)
    live = pool.new_sequence([1, 2, 3, 4, 0])
    assert live.n_cached == 4  # reuse between live sequences still works
    live.release(), a.release()
    assert pool.prefix_index == {} and pool.new_sequence([1, 2, 3, 4, 0]).n_cached == 0


def test_decoded_tokens_become_shareable_when_declared():
    pool = PagedKVPool.for_model(TOY, 16, 2)
    a = pool.new_sequence([1, 2, 3])
    forward(TOY, a.pending_tokens, a)
    for t in [4, 5, 0]:
        a.add_tokens([t])
        forward(TOY, [t], a)
    b = pool.new_sequence([1, 2, 3, 4, 5, 0, 1])
    assert b.n_cached == 6
    close(forward(TOY, b.pending_tokens, b), forward(TOY, [1, 2, 3, 4, 5, 0, 1], None)[-1:], 1e-12)


def test_hash_chain_depends_on_the_whole_prefix():
    assert block_hashes([1, 2, 3, 4], 2)[1] != block_hashes([9, 9, 3, 4], 2)[1]  # same block, other parent
    assert block_hashes([1, 2, 3, 4, 5], 2) == [block_hash(None, [1, 2]), block_hash(block_hash(None, [1, 2]), [3, 4])]
    assert block_hashes([1, 2, 3], 4) == []


def test_pool_exhaustion_is_clear_and_changes_nothing():
    pool = PagedKVPool.for_model(TOY, 3, 2)
    a = pool.new_sequence()
    forward(TOY, [1, 2, 3, 4, 5], a)  # 3 blocks: the pool is full
    table = list(a.block_table)
    with pytest.raises(PoolExhaustedError, match=r"needs 1 new block\(s\) but only 0 of 3 are free"):
        forward(TOY, [0, 1], a)
    assert len(a) == 5 and a.block_table == table  # nothing was written
    assert pool.stats().filled_slots == 5
    assert a.blocks_needed(1) == 0 and a.blocks_needed(2) == 1 and a.blocks_needed(5) == 2
    b = pool.new_sequence()
    with pytest.raises(PoolExhaustedError, match="needs 2 new"):
        b.reserve(3)
    a.release()
    b.reserve(3)
    assert b.n_blocks == 2 and len(b) == 0
    forward(TOY, [1, 2, 3], b)
    assert b.n_blocks == 2


def test_copy_on_write_counts_towards_exhaustion():
    pool = PagedKVPool.for_model(TOY, 2, 4)
    a = pool.new_sequence()
    forward(TOY, [1, 2, 3, 4, 5], a)
    b = a.fork()
    assert b.blocks_needed(1) == 1  # the shared partial block must be copied
    with pytest.raises(PoolExhaustedError, match="0 new, 1 copy-on-write"):
        forward(TOY, [0], b)
    assert len(b) == 5 and pool.copies == 0
    a.release()  # now b holds the blocks alone: it writes in place
    forward(TOY, [0], b)
    assert pool.copies == 0 and len(b) == 6


def test_wrong_model_and_bad_arguments():
    pool = PagedKVPool.for_model(TOY, 4, 2)
    seq = pool.new_sequence()
    with pytest.raises(ValueError, match="made for another model"):
        forward(ROPE, [1, 2], seq)
    toy32 = toy_model(dtype=np.float32)
    with pytest.raises(ValueError, match="holds float64 but the model computes in float32"):
        forward(toy32, [1, 2], seq)
    with pytest.raises(ValueError, match=r"k_new must have shape \[S, 1, 4\]"):
        seq.append(0, np.zeros((2, 2, 4)), np.zeros((2, 2, 4)))
    with pytest.raises(ValueError, match="layer must be in 0..1"):
        seq.append(2, np.zeros((1, 1, 4)), np.zeros((1, 1, 4)))
    with pytest.raises(ValueError, match="layer must be in 0..1"):
        seq.layer_rows(-1, 1)
    with pytest.raises(ValueError, match=r"n_new must be a number of new positions >= 0, got -1"):
        seq.layer_rows(0, -1)
    for bad in (range(0, 3), range(1, 1), range(0, 2, 2), [0, 1]):
        with pytest.raises(ValueError, match=r"layer must be in 0..1 \(or a range of them\)"):
            seq.layer_rows(bad, 1)
    assert seq.lengths == [0, 0]  # nothing taken by the refused calls
    with pytest.raises(ValueError, match="n_blocks must be a positive integer"):
        PagedKVPool(TOY.config, 0, 4)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        PagedKVPool(TOY.config, 4, 2.5)
    with pytest.raises(TypeError, match="Config"):
        PagedKVPool({"n_layers": 2}, 4, 2)
    with pytest.raises(ValueError, match="floating-point"):
        PagedKVPool(TOY.config, 4, 2, dtype="nonsense")
    with pytest.raises(ValueError, match="floating-point"):
        PagedKVPool(TOY.config, 4, 2, dtype=np.int32)
    with pytest.raises(ValueError, match="out of range"):
        pool.new_sequence([1, 99])
    with pytest.raises(ValueError, match="cannot truncate"):
        seq.truncate(1)
    seq.layer_rows(0, 1)
    with pytest.raises(ValueError, match=r"range\(0, 2\) of sequence 0 hold different numbers of positions: \[1, 0\]"):
        seq.layer_rows(range(2), 1)


def test_layer_rows_over_a_range_of_layers_does_each_ones_bookkeeping_at_once():
    """A pass that runs every layer in one compiled call takes their rows at once: the same
    blocks, copies, fills, lengths and prefix entries as one call a layer, and each layer's rows."""
    pool, pool2 = PagedKVPool.for_model(TOY, 8, 2), PagedKVPool.for_model(TOY, 8, 2)
    seqs = []
    for p in (pool, pool2):
        parent = p.new_sequence([3, 1, 4])
        forward(TOY, [3, 1, 4], parent)
        seqs.append(parent.fork())  # shares the partial block: the next rows copy it first
        seqs[-1].add_tokens([1, 5])
    at_once = seqs[0].layer_rows(range(2), 2)
    one_by_one = [seqs[1].layer_rows(l, 2) for l in range(2)]
    assert [k is pool._rows[l][0] for l, k in enumerate(at_once[0])] == [True, True]
    assert [v is pool._rows[l][1] for l, v in enumerate(at_once[1])] == [True, True]
    assert np.array_equal(at_once[2], one_by_one[1][2]) and at_once[3:] == one_by_one[1][3:] == (2, 3)
    assert seqs[0].lengths == seqs[1].lengths == [5, 5] and pool.copies == pool2.copies == 1
    assert np.array_equal(pool.fill, pool2.fill) and pool.prefix_index.keys() == pool2.prefix_index.keys()


def test_block_table_matrix_and_stats():
    pool = PagedKVPool.for_model(TOY, 12, 3)
    seqs = [pool.new_sequence() for _ in range(3)]
    for s, n in zip(seqs, [7, 2, 4]):
        forward(TOY, [1] * n, s)
    mat = pool.block_table_matrix()
    assert mat.tolist() == [[0, 1, 2], [3, -1, -1], [4, 5, -1]]
    s = pool.stats()
    assert s.tokens == 13 and s.slots == 18 and s.waste == 5 == sum(q.waste for q in seqs)
    assert all(q.waste < 3 for q in seqs)


def test_scheduler_backend_matches_generate():
    scheduler = pytest.importorskip("tinydecoder.serving.scheduler")
    system = [0, 1, 2, 3, 4, 5, 0, 1]
    reqs = [scheduler.Request(system + [2, 3], 4, arrival=0), scheduler.Request(system + [4], 3, arrival=6),
            scheduler.Request([5, 4, 3], 3, arrival=1)]
    backend = PagedKV(TOY, 12, 4)
    sched = scheduler.run_schedule(TOY, reqs, token_budget=4, backend=backend)
    for r, res in zip(reqs, sched.results):
        assert res.tokens == generate(TOY, list(r.prompt), r.max_new_tokens).new_tokens
    assert [res.cached_tokens for res in sched.results] == [0, 8, 0]
    assert backend.pool.stats().blocks_used == 0 and backend.free_blocks == 12


# ------------------------------------------------------------------ memory on a request trace
from tinydecoder.lessons.memory_replay import (  # noqa: E402
    ContiguousArena,
    WorkloadRequest,
    block_size_view,
    first_fit_replay,
    paged_replay,
    request_workload,
    workload_memory,
)


def test_request_trace_is_seeded_and_sane():
    a, b = request_workload(12, seed=5), request_workload(12, seed=5)
    assert a == b and a != request_workload(12, seed=6)
    assert a[0].arrival == 0 and all(x.arrival <= y.arrival for x, y in zip(a, a[1:]))
    assert all(2 <= r.prompt_len <= 24 and 1 <= r.output_len <= r.max_new_tokens == 24 for r in a)
    r = WorkloadRequest(0, arrival=3, prompt_len=5, output_len=4, max_new_tokens=6)
    assert [r.length_at(t) for t in range(2, 8)] == [0, 5, 6, 7, 8, 0]
    assert r.positions_needed == 10 and r.last_step == 6
    with pytest.raises(ValueError, match="prompt_range"):
        request_workload(3, prompt_range=(0, 4))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 1000), block=st.sampled_from([1, 3, 4, 16]))
def test_trace_memory_paged_waste_is_under_one_block_per_sequence(seed, block):
    workload = request_workload(10, seed=seed)
    mem = workload_memory(workload, block)
    live = np.array([sum(1 for r in workload if r.length_at(t)) for t in mem.steps])
    assert mem.tokens.tolist() == [sum(r.length_at(t) for r in workload) for t in mem.steps]
    assert np.all(mem.paged_waste >= 0) and np.all(mem.paged_waste <= (block - 1) * live)
    assert np.all(mem.seq_waste < block)
    assert np.all(mem.reserved >= mem.tokens)
    assert ((mem.pool_map == 2).sum(axis=1) == mem.tokens).all()  # the pool's own fill counts
    assert ((mem.pool_map > 0).sum(axis=1) == mem.paged_slots).all()
    if block == 1:
        assert (mem.paged_slots == mem.tokens).all()
    for t in (0, len(mem.steps) // 2):  # tables: live requests have ceil(len / B) distinct blocks
        tab = mem.tables[t]
        held = tab[tab >= 0]
        assert len(held) == len(set(held.tolist())) == sum(-(-r.length_at(t) // block) for r in workload)


def test_contiguous_arena_first_fit_and_holes():
    arena = ContiguousArena(10)
    assert arena.allocate(4, 0) == 0 and arena.allocate(3, 1) == 4 and arena.allocate(3, 2) == 7
    assert arena.allocate(1) is None and arena.free_slots == 0
    arena.free(0), arena.free(7)
    assert arena.holes() == [(0, 4), (7, 3)] and arena.free_slots == 7 and arena.largest_hole == 4
    assert arena.allocate(5) is None  # 7 slots free, but no hole of 5: fragmentation
    assert arena.allocate(2, 3) == 0 and arena.allocate(3, 4) == 7  # first fit: the lowest hole that fits
    assert arena.owner_map().tolist() == [3, 3, -1, -1, 1, 1, 1, 4, 4, 4]
    with pytest.raises(ValueError, match="no range starts at slot 5"):
        arena.free(5)


def test_replays_contiguous_vs_paged():
    workload = request_workload(20, seed=0, mean_gap=2.0)
    mem = workload_memory(workload, 4)
    roomy = first_fit_replay(workload, sum(r.positions_needed for r in workload))
    assert roomy["admitted"] == 20 and not roomy["rejected"]
    assert ((roomy["states"] == 2).sum(axis=1) == mem.tokens).all()
    assert ((roomy["states"] > 0).sum(axis=1) == mem.reserved).all()
    arena = int(mem.paged_slots.max())  # exactly what paging needs at its peak
    tight = first_fit_replay(workload, arena)
    assert tight["admitted"] < 20
    for r in tight["rejected"]:
        assert r["largest_hole"] < r["need"]
        assert r["fragmentation"] == (r["free"] >= r["need"])
    paged = paged_replay(workload, arena // 4, 4)
    assert paged["admitted"] == 20 and not paged["exhausted"] and paged["free_blocks"].min() == 0
    starved = paged_replay(workload, 10, 4)
    assert starved["admitted"] < 20


def test_block_size_view_and_figures():
    import matplotlib.pyplot as plt

    from tinydecoder import viz, widgets

    workload = request_workload(8, seed=1)
    view = block_size_view(workload, 4, 5)
    mem = workload_memory(workload, 4)
    assert view["tokens"] == mem.tokens[5] and view["paged_waste"] == mem.paged_waste[5]
    assert view["table"].shape[0] == 8 and view["max_seq_waste"] <= 3
    assert block_size_view(workload, 4, 10_000)["step"] == len(mem.steps) - 1
    fig = widgets.block_size_figure(view | {"block_size": 4})
    assert "waste" in fig.axes[0].get_title()
    plt.close(fig)
    fig, ax = plt.subplots()
    im = viz.block_table_heatmap(ax, [[0, 1], [0, -1]], ["a", "b"], shared=[(0, 0), (1, 0)])
    assert im.colorbar is not None and ax.get_xlabel() == "logical block"
    assert sum(isinstance(p, plt.Rectangle) and p.get_edgecolor()[0] == 1.0 for p in ax.patches) >= 2
    viz.memory_map(ax, mem.pool_map, slots_per_block=4)
    viz.workload_memory_lines(ax, mem)
    plt.close(fig)
    with pytest.raises(ValueError, match="2-D"):
        viz.block_table_heatmap(ax, [1, 2])


def test_block_size_widget_redraws_on_slider():
    from tinydecoder.widgets import block_size_widget

    workload = request_workload(8, seed=1)
    box = block_size_widget(workload, 5)
    assert box.controls["block_size"].description == "block size"
    assert box.data["block_size"] == 4
    box.controls["block_size"].value = 1
    assert box.data["paged_waste"] == 0 and box.data["block_size"] == 1
    box.controls["block_size"].value = 16
    assert box.data["paged_waste"] == block_size_view(workload, 16, 5)["paged_waste"] > 0


def test_truncate_then_continue_matches_contiguous_and_forgets_partial_prefix():
    tokens = [1, 2, 3, 4, 5, 0, 1, 2]
    pool = PagedKVPool.for_model(TOY, 8, 4)
    seq = pool.new_sequence(tokens)
    forward(TOY, seq.pending_tokens, seq)
    assert len(pool.prefix_index) == 2
    ref = TOY.new_cache()
    forward(TOY, tokens, ref)
    seq.truncate(6), ref.truncate(6)  # back into the second (full, registered) block
    assert seq.n_blocks == 2 and len(pool.prefix_index) == 1 and seq.tokens == tokens[:6]
    close(forward(TOY, [3, 3], seq), forward(TOY, [3, 3], ref), 1e-12)
    assert pool.new_sequence(tokens + [0]).n_cached == 4  # the stale second block is not reused
    other = pool.new_sequence([1, 2, 3, 4, 9 % 6, 9 % 6, 1])
    assert other.n_cached == 4
    seq.truncate(0)
    assert seq.n_blocks == 0 and len(seq) == 0


def test_the_sequence_is_passive_data_and_the_pool_owns_every_change():
    """No cycle: paged_sequence imports nothing of paged.py, and calls no private pool method."""
    import inspect

    from tinydecoder.serving import paged_sequence
    source = inspect.getsource(paged_sequence)
    assert "from .paged import" not in source and "TYPE_CHECKING" not in source
    assert "pool._" not in source
    pool = PagedKVPool(toy_model().config, n_blocks=4, block_size=2)
    seq = pool.new_sequence([0, 1, 2, 3, 4])
    pool.reserve(seq, 3)
    assert len(seq.block_table) == 2 and pool.blocks_used == 2
    assert pool.release(seq) == 2 and seq.release() == 0 and pool.blocks_free == 4
