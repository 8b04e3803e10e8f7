"""The radix-tree prefix cache (serving/radix.py), its replay against the block-hash chain
(serving/prefix_replay.py) and the radix store with real K/V (serving/radix_kv.py), each against
cases worked out by hand."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.serving.paged import PagedKVPool
from tinydecoder.serving.prefix_replay import BlockHashCache, RadixReplay, ReplayRequest, replay
from tinydecoder.serving.radix import CacheFullError, RadixCache, RadixNode
from tinydecoder.serving.radix_kv import RadixKVStore


def edges(tree):
    """Every node as (path tokens before it, its edge), parents first."""
    out = []
    for node in tree.nodes():
        before, n = [], node.parent
        while n is not tree.root:
            before[:0] = n.key
            n = n.parent
        out.append((tuple(before), node.key))
    return out


# ----------------------------------------------------------------- match / insert / split
def test_insert_split_and_match_by_hand():
    tree = RadixCache()
    assert tree.insert([1, 2, 3, 4], values=[10, 11, 12, 13]) == 0
    assert edges(tree) == [((), (1, 2, 3, 4))]
    # [1, 2, 5] shares [1, 2]: the edge splits after two tokens, 5 hangs off the cut
    assert tree.insert([1, 2, 5], values=[20, 21, 22]) == 2
    assert edges(tree) == [((), (1, 2)), ((1, 2), (3, 4)), ((1, 2), (5,))]
    assert len(tree) == 5  # 1 2 3 4 5: the shared tokens are stored once
    assert sorted(tree.sequences()) == [[1, 2, 3, 4], [1, 2, 5]]

    m = tree.match_prefix([1, 2, 3, 9])  # diverges inside the edge (3, 4)
    assert (m.length, m.ends) == (3, "branch point")
    assert m.values.tolist() == [10, 11, 12]  # the tree keeps the first writer's values
    assert m.node.key == (3,)  # split so that the node ends exactly at the match
    assert edges(tree) == [((), (1, 2)), ((1, 2), (3,)), ((1, 2, 3), (4,)), ((1, 2), (5,))]
    assert len(tree) == 5  # a split moves no token

    m = tree.match_prefix([1, 2, 5, 6])
    assert (m.length, m.ends, m.values.tolist()) == (3, "end of a cached sequence", [10, 11, 22])
    m = tree.match_prefix([1, 2])
    assert (m.length, m.ends, m.node.key) == (2, "end of the query", (1, 2))
    m = tree.match_prefix([7, 1, 2])
    assert (m.length, m.ends, m.node) == (0, "empty", tree.root)
    assert tree.insert([1, 2, 3, 4], values=[0, 0, 0, 0]) == 4  # all there already: nothing added
    assert len(tree) == 5


def test_match_without_split_leaves_the_tree_alone():
    tree = RadixCache()
    tree.insert([5, 6, 7, 8])
    m = tree.match_prefix([5, 6, 9], split=False)
    assert m.length == 2 and m.node is tree.root and edges(tree) == [((), (5, 6, 7, 8))]


def test_a_wrong_split_would_be_caught():
    """The failure a split must not have: a match longer than the real common prefix."""
    tree = RadixCache()
    tree.insert([1, 2, 3])
    tree.insert([1, 9, 9])
    for query, expected in [([1, 2, 9], 2), ([1, 9, 3], 2), ([2], 0), ([1], 1), ([1, 2, 3, 4], 3)]:
        assert tree.match_prefix(query).length == expected
    assert sorted(tree.sequences()) == [[1, 2, 3], [1, 9, 9]]


# --------------------------------------------------------------------- locks / eviction
def build_lru_tree():
    """A at tick 1, B at tick 2, then a match of [1, 2, 3] at tick 3."""
    tree = RadixCache()
    tree.insert([1, 2, 3, 4], values=[10, 11, 12, 13])  # tick 1
    tree.insert([1, 2, 5], values=[20, 21, 22])  # tick 2: [1, 2] -> (3, 4), (5,)
    tree.match_prefix([1, 2, 3])  # tick 3: [1, 2] -> (3,) -> (4,); (5,) still at tick 2
    return tree


def test_evict_least_recently_used_leaf_first_by_hand():
    tree = build_lru_tree()
    first = tree.evict(1)
    assert (first.tokens, first.values.tolist(), first.nodes) == (1, [22], 1)  # (5,): used at tick 2
    assert sorted(tree.sequences()) == [[1, 2, 3, 4]]
    second = tree.evict(1)  # (4,) goes; its parent (3,) becomes a leaf but 1 token was enough
    assert second.values.tolist() == [13] and sorted(tree.sequences()) == [[1, 2, 3]]
    rest = tree.evict(100)  # the parents follow their children up to the root
    assert rest.tokens == 3 and len(tree) == 0 and tree.nodes() == []


def test_evicting_the_most_recent_first_would_be_caught():
    tree = build_lru_tree()
    tree.match_prefix([1, 2, 5])  # tick 4: now (5,) is the most recent leaf, (4,) the least
    assert tree.evict(1).values.tolist() == [13]


def test_a_locked_prefix_is_never_evicted():
    tree = build_lru_tree()
    m = tree.match_prefix([1, 2, 3])
    tree.lock(m.node)
    assert tree.locked_tokens == 3 and tree.evictable_tokens == 2
    out = tree.evict(100)
    assert sorted(out.values.tolist()) == [13, 22]  # only the unlocked leaves
    assert sorted(tree.sequences()) == [[1, 2, 3]]
    tree.unlock(m.node)
    assert tree.locked_tokens == 0 and tree.evict(100).tokens == 3


def test_locks_count_and_survive_a_split():
    tree = RadixCache()
    tree.insert([1, 2, 3, 4])
    node = tree.match_prefix([1, 2, 3, 4]).node
    tree.lock(node)
    tree.lock(node)
    tree.match_prefix([1, 2])  # splits the locked edge: both halves stay locked
    assert tree.locked_tokens == 4 and all(n.lock_ref == 2 for n in tree.nodes())
    tree.unlock(node)
    assert tree.evict(10).tokens == 0
    tree.unlock(node)
    assert tree.evict(10).tokens == 4
    tree.insert([7])
    with pytest.raises(ValueError, match="not locked"):
        tree.unlock(tree.match_prefix([7]).node)


def test_make_room_under_a_budget():
    tree = RadixCache(capacity_tokens=6)
    tree.insert([1, 2, 3, 4])
    m = tree.match_prefix([1, 2])
    tree.lock(m.node)
    assert tree.make_room(2).tokens == 0  # 4 + 2 = 6 fits
    tree.release_room(2)
    assert tree.make_room(4).tokens == 2  # 4 + 4 > 6: the unlocked (3, 4) goes
    tree.release_room(4)
    with pytest.raises(CacheFullError, match="locked"):
        tree.make_room(5)  # 2 locked + 5 > 6 whatever is evicted
    assert len(tree) == 2 and tree.reserved_tokens == 0


def test_bad_input_gets_clear_errors():
    tree = RadixCache()
    with pytest.raises(TypeError, match="sequence of token ids"):
        tree.insert("abc")
    with pytest.raises(ValueError, match=">= 0"):
        tree.match_prefix([1, -2])
    with pytest.raises(TypeError, match="integer token ids"):
        tree.insert([1.5, 2.0])
    with pytest.raises(ValueError, match="one entry per token"):
        tree.insert([1, 2], values=[1])
    with pytest.raises(ValueError, match="capacity_tokens"):
        RadixCache(0)
    with pytest.raises(TypeError, match="RadixNode"):
        tree.lock("root")
    tree.insert([1, 2, 3])
    other = RadixCache()
    other.insert([1, 2, 3])
    with pytest.raises(ValueError, match="not .*in this tree"):
        tree.lock(other.match_prefix([1, 2, 3]).node)
    with pytest.raises(ValueError, match="values with every sequence or with none"):
        tree.insert([4, 5], values=[0, 1])
    assert isinstance(tree.root, RadixNode)


# -------------------------------------------------------------------- replay: hit counts
TINY = [ReplayRequest("r0", [1, 2, 3, 4, 5], [6, 7]),  # caches 1..7 (partial last block [7] at B=2)
        ReplayRequest("r1", [1, 2, 3, 4, 5, 6, 7, 8, 9]),  # the next turn: extends r0's sequence
        ReplayRequest("r2", [1, 2, 3, 9, 9])]  # branches inside the block [3, 4]


def test_hit_counts_by_hand_radix_vs_hash_chain():
    radix = replay(TINY, RadixReplay())
    # r0: nothing cached; r1: all of r0's 7 tokens; r2: [1, 2, 3] up to the branch
    assert [r[2] for r in radix.rows] == [0, 7, 3]
    assert (radix.cached_tokens, radix.prompt_tokens) == (10, 19)
    hashes = replay(TINY, BlockHashCache(block_size=2))
    # r1: blocks [1,2] [3,4] [5,6] (r0's [7] was partial); r2: [1,2] only ([3,9] != [3,4])
    assert [r[2] for r in hashes.rows] == [0, 6, 2]
    assert hashes.hit_rate == pytest.approx(8 / 19)


def test_hash_chain_replay_agrees_with_the_paged_pool():
    """BlockHashCache with room to spare reuses what PagedKVPool's prefix index reuses."""
    cfg = td.Config(vocab_size=16, d_model=2, n_heads=1, n_kv_heads=1, head_dim=2, n_layers=1, d_ff=2,
                    max_context=64)
    workload = TINY + [ReplayRequest("r3", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), ReplayRequest("r4", [1, 2, 3, 9, 9, 1])]
    for block_size in (1, 2, 3, 4):
        pool = PagedKVPool(cfg, n_blocks=64, block_size=block_size)
        from_pool = []
        for r in workload:
            seq = pool.new_sequence(list(r.prompt))
            from_pool.append(seq.n_cached)
            rows = np.zeros((len(r.sequence) - seq.n_cached, 1, 2), np.float32)
            if r.output:
                seq.add_tokens(list(r.output))
            seq.append(0, rows, rows)
            seq.release()
        assert [row[2] for row in replay(workload, BlockHashCache(block_size)).rows] == from_pool


def test_longest_prefix_first_beats_fcfs_under_a_small_budget_by_hand():
    a0, b0, a1, b1 = (ReplayRequest(n, p) for n, p in
                      [("a0", [1, 1, 1, 1, 10]), ("b0", [2, 2, 2, 2, 20]), ("a1", [1, 1, 1, 1, 11]), ("b1", [2, 2, 2, 2, 21])])
    arrivals = [a0, b0, a1, b1]
    # room for 6 tokens: FCFS alternates a, b, a, b and every request evicts the other's prefix
    fcfs = replay(arrivals, RadixReplay(capacity_tokens=6), "fcfs")
    assert fcfs.order == ["a0", "b0", "a1", "b1"] and fcfs.cached_tokens == 0
    # LPM runs a1 right after a0 (4 tokens found), then b0, then b1 (4 tokens found)
    lpm = replay(arrivals, RadixReplay(capacity_tokens=6), "lpm")
    assert lpm.order == ["a0", "a1", "b0", "b1"] and [r[2] for r in lpm.rows] == [0, 4, 0, 4]
    hashes = replay(arrivals, BlockHashCache(2, capacity_blocks=3), "lpm")
    assert hashes.cached_tokens == 8 and replay(arrivals, BlockHashCache(2, capacity_blocks=3)).cached_tokens == 0


def test_replay_rejects_what_it_cannot_run():
    with pytest.raises(ValueError, match="policy"):
        replay(TINY, RadixReplay(), "random")
    with pytest.raises(ValueError, match="empty prompt"):
        ReplayRequest("e", [])
    with pytest.raises(ValueError, match="unique"):
        replay([TINY[0], TINY[0]], RadixReplay())
    with pytest.raises(CacheFullError):
        replay(TINY, RadixReplay(capacity_tokens=4))
    with pytest.raises(CacheFullError):
        replay(TINY, BlockHashCache(2, capacity_blocks=2))


# ------------------------------------------------------------- real K/V through the tree
def test_radix_store_gives_the_one_shot_logits():
    model = td.random_model(td.Config(vocab_size=32, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=2,
                                      d_ff=32, max_context=64, position="rope"), seed=1, dtype=np.float64)
    store = RadixKVStore(model, capacity_tokens=24)
    turns = [([3, 4, 5, 6, 7], [8, 9]), ([3, 4, 5, 6, 7, 8, 9, 10, 11], [12]), ([3, 4, 5, 1, 1, 2], [])]
    cached = []
    for prompt, output in turns:
        step = store.prefill(prompt)
        np.testing.assert_allclose(step.logits, td.forward_fast(model, prompt)[step.cached:], rtol=0, atol=1e-12)
        if output:
            td.forward_fast(model, output, step.cache)
        store.finish(step, output)
        cached.append(step.cached)
    assert cached == [0, 7, 3]
    assert len(store.tree) + len(store.free) == 24  # every slot is in the tree or free
    slots = [int(s) for n in store.tree.nodes() for s in n.values]
    assert len(set(slots)) == len(slots) == len(store.tree)
    big = store.prefill(list(range(20)))  # evicts to make room; logits still exact
    np.testing.assert_allclose(big.logits, td.forward_fast(model, list(range(20))), rtol=0, atol=1e-12)
    store.finish(big)
    assert len(store.tree) + len(store.free) == 24


def test_eviction_granularity_by_hand():
    """Room for 4 tokens. r0 caches [1, 2, 3, 4]; r1 needs 2 tokens of room; r2 asks for [1, 2, 3].
    The chain frees r0's blocks tail first, so r1 evicts [4] and [3] and r2 finds [1, 2]; had it
    freed head first, [1] and [2] would go and r2 would find nothing. The tree evicts r0's leaf
    whole (no other request has split it), so r2 finds nothing there."""
    work = [ReplayRequest("r0", [1, 2, 3, 4]), ReplayRequest("r1", [5, 6]), ReplayRequest("r2", [1, 2, 3, 9])]
    assert [r[2] for r in replay(work, BlockHashCache(1, capacity_blocks=4)).rows] == [0, 0, 2]
    assert [r[2] for r in replay(work, RadixReplay(capacity_tokens=4)).rows] == [0, 0, 0]


def test_prefix_reuse_is_what_the_paged_pool_hands_back():
    """prefix_reuse (notebook 18's widget) predicts, per block size, the tokens a PagedKVPool with
    prefix caching hands each later prompt; the shared prefix bounds it; bad sizes are refused."""
    import numpy as np

    import tinydecoder as td
    from tinydecoder.serving.paged import PagedKVPool
    from tinydecoder.serving.prefix_replay import prefix_reuse, shared_prefix

    rng = np.random.default_rng(3)
    head = list(rng.integers(0, 50, 37))
    prompts = [head + list(rng.integers(0, 50, n)) for n in (5, 12, 1)] + [head[:20] + [7, 7, 7]]
    cfg = td.Config(vocab_size=50, d_model=8, n_heads=2, n_kv_heads=1, head_dim=4, n_layers=1, d_ff=16,
                    max_context=128, position="rope", name="reuse")
    model = td.random_model(cfg, seed=1, dtype=np.float64)
    for B in (1, 4, 16, 64):
        view = prefix_reuse(prompts, B)
        pool = PagedKVPool.for_model(model, n_blocks=64, block_size=B)
        got = []
        for i, p in enumerate(prompts):
            seq = pool.new_sequence(p)
            if i:
                got.append(seq.n_cached)
            td.forward(model, seq.pending_tokens, seq)
        assert view["reused"] == got, B
        assert all(r <= s for r, s in zip(view["reused"], view["shared"]))
    assert shared_prefix([1, 2, 3], [1, 2, 4]) == 2 and shared_prefix([1, 2], [1, 2, 3]) == 2
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
            prefix_reuse(prompts, bad)
