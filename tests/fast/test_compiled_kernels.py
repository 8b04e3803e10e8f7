"""core/few_rows.py: a few rows times an out-major weight, each weight read once (numba), and
core/tiles.py's register tiles for more rows; the fast path that uses them; core/few_queries.py's
attention of the newest rows, core/prefill_attention.py's of many, vexp's exp and the compiled
SwiGLU (numba). The kernels are checked against float64 products (outputs
not a multiple of skinny's 4 or of a tile's 6, one to 100 rows: a tile's 16 rows, partly or
wholly filled, odd sizes, strided inputs); the fast path with them against the reference path on
float32 models whose weights are NOT shared with the reference side, for decode, a few rows
(speculative verification), batches of 2-40 rows and prefill; and the fast path without numba
(hidden) against the same. Speed is never asserted (perf/bench.py measures it)."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core import reference
from tinydecoder.core.model import LayerWeights, Model
from tinydecoder.core.toy import random_model
from tinydecoder.fast import forward_pass as fast
from tinydecoder.fast import tunables
from tinydecoder.fast.compiled import few_queries, few_rows, jit

needs_numba = pytest.mark.skipif(not jit.available(), reason="numba is not installed (the [fast] extra)")


def config(n_kv_heads, position="rope", tied=True, norm_scale=True):
    return td.Config(vocab_size=53, d_model=24, n_heads=6, n_kv_heads=n_kv_heads, head_dim=8, n_layers=3, d_ff=40,
                     max_context=400, position=position, norm_eps=1e-5, norm_scale=norm_scale,
                     tied_embeddings=tied, name="skinny-test")


CONFIGS = {"gqa-rope": config(2), "mha-table-untied-no-norm-weight": config(6, "table", tied=False, norm_scale=False)}


def tokens(n, seed=0):
    return np.random.default_rng(seed).integers(0, 53, n).tolist()


@needs_numba
@pytest.mark.parametrize("module", ["skinny", "tiles"])
@pytest.mark.parametrize("K, N", [(64, 96), (37, 5), (300, 1), (16, 2), (24, 13), (9, 23), (1, 7), (0, 7)])
@pytest.mark.parametrize("M", list(range(1, 12)) + [16, 17, 24, 25, 33, 100])
def test_rows_times_equals_the_product(module, K, N, M):
    """skinny's sweeps and tiles.py's register tiles, each for any number of rows (fast.project
    gives the tiles more than 8): N = 96 fills every tile, the other N leave outputs past the last
    whole tile of 6 (and of skinny's 4); for the tiles, M <= 8 is one 8-row tile alone, 9-11 and 25
    a partly filled 16-row tile, 16 whole ones, 17, 24, 33 and 100 whole ones and a last 8-row
    tile; K = 0 is a sum of nothing."""
    from tinydecoder.fast.compiled import tiles

    rows_times = {"skinny": few_rows.rows_times, "tiles": tiles.rows_times}[module]
    rng = np.random.default_rng(K * 100 + N * 10 + M)
    w = np.asfortranarray(rng.standard_normal((K, N)).astype(np.float32))
    x = rng.standard_normal((M, K + 3)).astype(np.float32)[:, 2:K + 2]  # a strided view
    out = np.full((M, N), np.nan, np.float32)
    assert rows_times(x, w, out) is out
    want = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max() + 1e-6)


@needs_numba
def test_tiles_pack_into_a_reused_work_array():
    """tiles.product packs the rows into the work array it is given (as a pass hands the same one
    to all its products), whatever that array held: rows past M are zeroed, and a product with
    fewer rows or a shorter K reuses it. A work array too small for the product is not used."""
    from tinydecoder.fast.compiled import tiles

    rng = np.random.default_rng(7)
    work = np.full(tiles.work_numbers(40, 50), np.nan, np.float32)
    for M, K, N in [(40, 50, 12), (25, 50, 7), (9, 31, 12), (17, 50, 6), (33, 20, 13), (40, 50, 12)]:
        w = np.asfortranarray(rng.standard_normal((K, N)).astype(np.float32))
        x = rng.standard_normal((M, K)).astype(np.float32)
        out = np.full((M, N), np.nan, np.float32)
        assert tiles.product(x, w, out, work) is out
        want = x.astype(np.float64) @ w.astype(np.float64)
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max())
        blocks = -(-(M - (M % 16 if M % 16 <= 8 else 0)) // 16)
        np.testing.assert_array_equal(work[:blocks * K * 16].reshape(blocks, K, 16),
                                      tiles.pack_rows(x[:blocks * 16] if M % 16 <= 8 else x))  # packed as pack_rows packs
    small = np.full(10, np.nan, np.float32)
    x, w = rng.standard_normal((20, 8)).astype(np.float32), np.asfortranarray(rng.standard_normal((8, 6)).astype(np.float32))
    out = tiles.product(x, w, np.empty((20, 6), np.float32), small)
    np.testing.assert_allclose(out, x @ w, rtol=1e-5, atol=1e-5)
    assert np.isnan(small).all()  # too small: a new array was packed instead


@needs_numba
@pytest.mark.parametrize("module", ["skinny", "tiles"])
def test_rows_times_refuses_what_it_cannot_read(module):
    from tinydecoder.fast.compiled import tiles

    rows_times = {"skinny": few_rows.rows_times, "tiles": tiles.rows_times}[module]
    x = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match=r"out-major .*got x float32\[2, 8\], w float32\[8, 4\] C"):
        rows_times(x, np.ones((8, 4), np.float32), np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="float64"):
        rows_times(x.astype(np.float64), np.ones((8, 4), np.float32, order="F"), np.empty((2, 4)))
    with pytest.raises(ValueError, match=r"C-contiguous float32 out of shape \[2, 4\], got float32\[2, 5\]"):
        rows_times(x, np.ones((8, 4), np.float32, order="F"), np.empty((2, 5), np.float32))


@pytest.mark.parametrize("missing", ["numba", "threadpoolctl"])
def test_the_kernels_need_both_packages_of_the_fast_extra(missing, monkeypatch):
    """numba without threadpoolctl is not used: numpy's BLAS threads would spin beside numba's."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real(name, *a))
    assert not jit._fast_extra_installed()


def float32_pair(name, seed=3):
    """(reference side in float64, fast side: the same weights as float32 copies, every matrix
    stored out-major as checkpoint.weights stores SmolLM2's; no array shared between them)."""
    ref = random_model(CONFIGS[name], seed=seed, dtype=np.float64)

    def f32(a):
        return None if a is None else np.asfortranarray(a, np.float32) if a.ndim == 2 else a.astype(np.float32)

    layers = [LayerWeights(**{k: f32(v) for k, v in layer.arrays().items()}) for layer in ref.layers]
    mine = Model(ref.config, embed=np.ascontiguousarray(ref.embed, np.float32), layers=layers,
                 final_norm=f32(ref.final_norm), pos_table=f32(ref.pos_table),
                 lm_head=None if ref.config.tied_embeddings else f32(ref.lm_head))
    return ref, mine


def assert_float32_close(got, want):
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


@pytest.fixture(params=["numba", "numpy"])
def kernel(request, monkeypatch):
    """Run the test with the skinny kernel on every matrix (threshold 0), or with numba hidden."""
    if request.param == "numba":
        if not jit.available():
            pytest.skip("numba is not installed")
        monkeypatch.setattr(tunables, "SKINNY_MIN_WEIGHTS", 0)
        from tinydecoder.fast.compiled import prefill_attention, tiles

        calls = []  # (kernel, rows) of each product fast.project runs in numba, and of each prefill's attention
        for name, module in (("skinny", few_rows), ("tiles", tiles)):  # what fast.project calls: rows_times without its checks
            real = module.product
            monkeypatch.setattr(module, "product", lambda x, w, out, *work, real=real, name=name:
                                calls.append((name, x.shape[0])) or real(x, w, out, *work))
        real_attention = prefill_attention.attend_prefill
        monkeypatch.setattr(prefill_attention, "attend_prefill",
                            lambda q, k, v, *out: calls.append(("attention", q.shape[0])) or real_attention(q, k, v, *out))
        return calls
    monkeypatch.setattr(jit, "_HAVE_FAST", False)
    return None


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fast_path_with_and_without_numba_equals_reference(name, kernel):
    ref, mine = float32_pair(name)
    assert mine.lm_head.flags.f_contiguous and mine.layers[0].w_down.flags.f_contiguous
    ids = tokens(40, seed=1)
    want = reference.forward(ref, ids)
    cache = mine.new_cache(64)
    assert_float32_close(fast.forward(mine, ids[:30], cache), want[:30])  # prefill: more rows than a block
    assert_float32_close(fast.forward(mine, ids[30:34], cache), want[30:34])  # 4 guesses checked at once
    for i in range(34, 40):  # decode steps
        assert_float32_close(fast.forward(mine, ids[i:i + 1], cache, last_only=True), want[i:i + 1])
    if kernel is not None:  # numba ran the prefill's 30 rows (tiles), the 4-row check and the 1-row steps (sweeps)
        assert {("tiles", 30), ("skinny", 4), ("skinny", 1), ("attention", 30)} <= set(kernel)
    rows = [tokens(n, seed=s) for s, n in enumerate([3, 1, 5, 2])]
    for got, ids_s in zip(fast.forward_batch(mine, rows), rows):
        assert_float32_close(got, reference.forward(ref, ids_s))


@pytest.mark.parametrize("batch", [2, 8, 40])
def test_batched_decode_with_the_kernel_equals_reference(batch, kernel):
    ref, mine = float32_pair("gqa-rope")
    prompts = [tokens(4, seed=10 + b) for b in range(batch)]
    nxt = [tokens(1, seed=100 + b) for b in range(batch)]
    caches = [mine.new_cache(8) for _ in range(batch)]
    fast.forward_batch(mine, prompts, caches)
    stacked = fast.BatchKVCache.stack(caches, extra=1)
    if kernel is not None:
        kernel.clear()  # count the decode step's products only
    got = fast.forward_batch(mine, nxt, stacked, last_only=True)
    for b in range(batch):
        assert_float32_close(got[b], reference.forward(ref, prompts[b] + nxt[b])[-1:])
    if kernel is not None:  # every product of the step runs in numba, all B rows in one call
        assert set(kernel) == {("skinny" if batch <= tunables.SWEEPS_UP_TO_ROWS else "tiles", batch)}


@needs_numba
@pytest.mark.parametrize("Hq, Hkv", [(9, 3), (4, 4), (6, 1), (10, 2)])
@pytest.mark.parametrize("T", [1, 3, 130])
@pytest.mark.parametrize("d", [12, 40, 64, 100])
def test_one_query_attention_equals_the_reference(Hq, Hkv, T, d):
    """core.few_queries.attend_rows with one row: the newest query over T cached positions, every head, as
    ops.attention computes it (float64 reference on the same numbers). Head sizes 12 (not a multiple
    of 8: scores one dot product at a time; values in a tile of 8 columns and 4 single ones), 40
    (dots8; five tiles of 8 columns), 64 (SmolLM2's: one tile of 64) and 100 (64 + 4 x 8 + 4);
    1, 3, 5 and 6 rows per KV head; positions in blocks of 8 and left over (T = 130)."""
    from tinydecoder.core import ops

    rng = np.random.default_rng(T * 10 + Hq + d)
    q = rng.standard_normal((Hq, d)).astype(np.float32)
    k = rng.standard_normal((T, Hkv, d)).astype(np.float32)
    v = rng.standard_normal((T, Hkv, d)).astype(np.float32)
    got = few_queries.attend_rows(q[None], k, v)
    want = ops.attention(q[None].astype(np.float64), k.astype(np.float64), v.astype(np.float64))  # [1, Hq, d]
    assert got.shape == (1, Hq * d)
    np.testing.assert_allclose(got, want.reshape(1, Hq * d), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=rf"Hq a multiple of Hkv.*got q float64\[1, {Hq}, {d}\]"):
        few_queries.attend_rows(q[None].astype(np.float64), k, v)


@needs_numba
@pytest.mark.parametrize("Hq, Hkv", [(9, 3), (4, 4), (6, 1), (10, 2)])
@pytest.mark.parametrize("S, T", [(1, 1), (2, 2), (3, 5), (4, 130), (8, 9), (8, 300), (5, 64)])
@pytest.mark.parametrize("d", [16, 64])
def test_attention_of_the_newest_rows_is_causal_and_equals_the_reference(Hq, Hkv, S, T, d):
    """core.few_queries.attend_rows: S new positions (a decode step, guesses checked at once) over
    T cached positions, the S included: each query sees the positions up to its own, as
    ops.attention computes it in float64. T = S (every block of positions holds some query's
    future), T smaller than the number of tasks (empty blocks), and long caches."""
    from tinydecoder.core import ops

    rng = np.random.default_rng(S * 1000 + T * 10 + Hq + d)
    q = (rng.standard_normal((S, Hq, d)) * 2).astype(np.float32)
    k = (rng.standard_normal((T, Hkv, d)) * 2).astype(np.float32)
    v = rng.standard_normal((T, Hkv, d)).astype(np.float32)
    got = few_queries.attend_rows(q, k, v)
    want = ops.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))  # [S, Hq*d]
    assert got.shape == (S, Hq * d) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    if S > 1:  # the first query must not see the last position: changing it leaves row 0 as it was
        v2 = v.copy()
        v2[-1] += 100.0
        again = few_queries.attend_rows(q, k, v2)
        np.testing.assert_array_equal(again[0], got[0])
        assert np.abs(again[-1] - got[-1]).max() > 1e-3


@needs_numba
def test_attention_of_the_newest_rows_refuses_what_it_cannot_read():
    q = np.ones((3, 4, 8), np.float32)
    k = np.ones((2, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"0 < S <= T.*got q float32\[3, 4, 8\], k float32\[2, 2, 8\]"):
        few_queries.attend_rows(q, k, k)  # three new rows but two positions
    with pytest.raises(ValueError, match=r"Hq a multiple of Hkv.*got q float32\[1, 3, 8\]"):
        few_queries.attend_rows(q[:1, :3], k, k)


@needs_numba
def test_the_first_call_of_a_kernel_runs_under_the_compile_lock_and_later_calls_do_not(monkeypatch):
    """jit.compiled: the first call (numba compiles, or loads its disk cache) holds the lock
    that makes two processes starting at once compile once; later calls go straight to numba."""
    import contextlib

    taken = []

    @contextlib.contextmanager
    def lock():
        taken.append("lock")
        yield

    def add_rows(x, out):  # a fresh function: nothing compiled for it yet
        for i in prange(x.shape[0]):  # noqa: F821 - numba.prange, bound by jit.compiled
            out[i] = x[i] + 1.0

    monkeypatch.setattr(jit, "_compile_lock", lock)
    monkeypatch.setattr(jit, "_compiled", {})
    x, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    first = jit.compiled(add_rows)
    first(x, out)
    assert taken == ["lock"] and out.tolist() == [1.0, 2.0, 3.0, 4.0]
    again = jit.compiled(add_rows)
    assert again is not first and hasattr(again, "signatures") and len(again.signatures) == 1  # numba's dispatcher
    again(x * 2, out)
    assert taken == ["lock"] and out.tolist() == [1.0, 3.0, 5.0, 7.0]
    first(x * 3, out)  # the function returned before the first call, kept by its caller: no lock either
    assert taken == ["lock"] and out.tolist() == [1.0, 4.0, 7.0, 10.0]
    with jit._compile_lock():  # the real lock: a file this process can take (and take again after)
        pass


@needs_numba
@pytest.mark.parametrize("B, Hq, Hkv", [(1, 9, 3), (5, 4, 4), (3, 6, 1)])
@pytest.mark.parametrize("T", [1, 7, 130])
def test_batched_one_query_attention_equals_the_reference_and_reads_only_t_positions(B, Hq, Hkv, T):
    """core.few_queries.attend_last_batch: each sequence's newest query over its first T positions
    of a [B, Hkv, capacity, d] buffer, as ops.attention computes it (float64, per sequence); the
    positions past T hold NaN, so reading any of them would show."""
    from tinydecoder.core import ops

    rng = np.random.default_rng(T * 100 + B * 10 + Hq)
    d, capacity = 16, T + 5
    q = rng.standard_normal((B, Hq, d)).astype(np.float32)
    k = np.full((B, Hkv, capacity, d), np.nan, np.float32)
    v = np.full((B, Hkv, capacity, d), np.nan, np.float32)
    k[:, :, :T] = rng.standard_normal((B, Hkv, T, d))
    v[:, :, :T] = rng.standard_normal((B, Hkv, T, d))
    got = few_queries.attend_last_batch(q, k, v, T)
    assert got.shape == (B, Hq * d)
    for b in range(B):
        want = ops.attention(q[b][None].astype(np.float64), k[b, :, :T].transpose(1, 0, 2).astype(np.float64),
                             v[b, :, :T].transpose(1, 0, 2).astype(np.float64))  # [1, Hq, d]
        np.testing.assert_allclose(got[b], want.reshape(Hq * d), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"0 < T <= capacity.*T=0"):
        few_queries.attend_last_batch(q, k, v, 0)
    with pytest.raises(ValueError, match=r"C-contiguous float32 k, v"):
        few_queries.attend_last_batch(q, k[:, :, :T], v[:, :, :T], T)  # a view: not the cache's own array


@needs_numba
@pytest.mark.parametrize("N, D", [(1, 576), (5, 37), (70, 8)])
def test_rmsnorm_into_compiled_equals_the_reference(N, D):
    """fast.rmsnorm_into on float32 with numba (one compiled call) against ops.rmsnorm in float64;
    without a weight it runs numpy's six calls, the same numbers."""
    from tinydecoder.core import ops

    rng = np.random.default_rng(N * D)
    x = (rng.standard_normal((N, D)) * 3).astype(np.float32)
    weight = rng.standard_normal(D).astype(np.float32)
    out = np.full((N, D), np.nan, np.float32)
    assert fast.rmsnorm_into(x, weight, 1e-5, out) is out
    want = ops.rmsnorm(x.astype(np.float64), weight.astype(np.float64), 1e-5)
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())
    plain = fast.rmsnorm_into(x, None, 1e-5, np.empty_like(x))
    np.testing.assert_allclose(plain, ops.rmsnorm(x.astype(np.float64), None, 1e-5), rtol=2e-6, atol=1e-6)


@needs_numba
def test_the_vectorised_exp_of_the_attention_kernels_matches_numpy():
    """vexp.exp_le0, the softmax's exp in one_query's kernels: within 5e-7 of exp (float64) relative
    for 0 >= x >= -87, exactly 1 at 0, and clamped at exp(-87) below (no subnormal, no garbage
    exponent bits); compiled into a loop as the kernels compile it."""
    import numba

    from tinydecoder.fast.compiled import vexp

    jit._bind(vexp.__dict__)
    exp_le0 = vexp.exp_le0

    @numba.njit(fastmath=True)
    def each(x, out):
        for i in range(x.size):
            out[i] = exp_le0(x[i])

    x = np.concatenate([np.linspace(-87, 0, 200_001), -np.random.default_rng(0).exponential(3, 10_000),
                        [0.0, -1e-30, -1e-6, -0.3465, -0.3466, -86.99, -87.5, -100.0, -1e30]]).astype(np.float32)
    got = np.empty_like(x)
    each(x, got)
    want = np.exp(x.astype(np.float64))
    inside = x >= -87
    assert np.abs(got[inside] / want[inside] - 1).max() < 5e-7
    assert got[x == 0].tolist() == [1.0, 1.0]
    np.testing.assert_allclose(got[~inside], np.exp(np.float64(-87)), rtol=5e-7)


@needs_numba
@pytest.mark.parametrize("Hq, Hkv, d", [(9, 3, 64), (6, 2, 8), (4, 4, 10), (6, 1, 16)])
@pytest.mark.parametrize("S, past", [(9, 0), (16, 0), (17, 3), (70, 30), (130, 0)])
def test_attention_of_many_new_rows_is_causal_and_equals_the_reference(Hq, Hkv, d, S, past):
    """core.prefill_attention.attend_prefill (a prefill, a long chunk): S new queries over the
    past + S cached positions, each seeing the positions up to its own, as ops.attention computes
    it in float64. Rows per KV head (S * Hq / Hkv) not a multiple of the tile's 16, head sizes not
    a multiple of its 6 columns, a past, and one KV head for all."""
    from tinydecoder.core import ops
    from tinydecoder.fast.compiled import prefill_attention

    rng = np.random.default_rng(S * 100 + past + Hq + d)
    q = (rng.standard_normal((S, Hq, d)) * 2).astype(np.float32)
    k = (rng.standard_normal((past + S, Hkv, d)) * 2).astype(np.float32)
    v = rng.standard_normal((past + S, Hkv, d)).astype(np.float32)
    got = prefill_attention.attend_prefill(q, k, v)
    want = ops.attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))  # [S, Hq*d]
    assert got.shape == (S, Hq * d) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    v2 = v.copy()
    v2[-1] += 100.0  # the last position: only the last query sees it
    again = prefill_attention.attend_prefill(q, k, v2)
    np.testing.assert_array_equal(again[:-1], got[:-1])
    assert np.abs(again[-1] - got[-1]).max() > 1e-3
    with pytest.raises(ValueError, match=r"0 < S <= T.*got q float32\[" + str(S)):
        prefill_attention.attend_prefill(q, k[:S - 1], v[:S - 1])


@pytest.mark.parametrize("N", [1, 3, 33])
def test_swiglu_with_and_without_numba_equals_its_definition(N, kernel):
    """fast.swiglu_into: with numba one compiled call (exp of -|gate| only, so that vexp's exp
    applies), without it numpy's five calls; both silu(gate) * up within float32 rounding of
    float64, for gates from -120 to 120 (exp(-gate) overflows float32 below -88)."""
    rng = np.random.default_rng(N)
    F = 37
    gate_up = np.concatenate([rng.uniform(-120, 120, (N, F)), rng.standard_normal((N, F))], axis=1).astype(np.float32)
    gate_up[0, :4] = [0.0, -0.0, 1e-30, -1e-30]
    out = np.full((N, F), np.nan, np.float32)
    with np.errstate(over="ignore"):  # numpy's form: exp(120) overflows to inf, and g / inf is the right 0
        assert fast.swiglu_into(gate_up, out) is out
    g, up = gate_up[:, :F].astype(np.float64), gate_up[:, F:].astype(np.float64)
    want = g / (1 + np.exp(-g)) * up
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-30)


@needs_numba
@pytest.mark.parametrize("block", [8, 16, 24])
@pytest.mark.parametrize("S, T", [(1, 1), (1, 7), (3, 40), (8, 130), (2, 300)])
@pytest.mark.parametrize("d", [16, 64, 100])
def test_attention_over_a_paged_caches_blocks_equals_the_gathered_cache_bit_for_bit(block, S, T, d):
    """few_queries.attend_rows_in_blocks: the same query rows over T positions whose K and V lie in a
    pool's blocks in scattered order (and blocks of other sequences between them) give exactly the
    numbers attend_rows gives on the positions gathered in order: the tasks split the positions
    alike and each stretch in one block adds its products in the same order (head sizes: dots8
    and a tile of 8 columns; a tile of 64; 64 + 4 x 8 + 4)."""
    Hq, Hkv = 6, 2
    rng = np.random.default_rng(block * 1000 + T + d)
    n_blocks = -(-T // block)
    table = rng.permutation(2 * n_blocks + 3)[:n_blocks]  # the sequence's blocks, among others
    k_rows = rng.standard_normal(((2 * n_blocks + 3) * block, Hkv, d)).astype(np.float32)
    v_rows = rng.standard_normal(k_rows.shape).astype(np.float32)
    q = rng.standard_normal((S, Hq, d)).astype(np.float32)
    at = np.array([table[t // block] * block + t % block for t in range(T)])
    want = few_queries.attend_rows(q, np.ascontiguousarray(k_rows[at]), np.ascontiguousarray(v_rows[at]))
    got = few_queries.attend_rows_in_blocks(q, k_rows, v_rows, table, block, T)
    np.testing.assert_array_equal(got, want)
    k_other = k_rows.copy()
    others = np.setdiff1d(np.arange(k_rows.shape[0]), at)
    k_other[others] = 1e3  # rows of other blocks are never read
    np.testing.assert_array_equal(few_queries.attend_rows_in_blocks(q, k_other, v_rows, table, block, T), want)


@needs_numba
def test_attention_over_blocks_refuses_what_it_cannot_read():
    q = np.ones((1, 4, 8), np.float32)
    k = np.ones((32, 2, 8), np.float32)
    with pytest.raises(ValueError, match="positive multiple of 8, got 12"):
        few_queries.attend_rows_in_blocks(q, k, k, [0, 1], 12, 20)
    with pytest.raises(ValueError, match=r"covering T = 40 positions.*table of 2 blocks of 16"):
        few_queries.attend_rows_in_blocks(q, k, k, [0, 1], 16, 40)
    with pytest.raises(ValueError, match="blocks inside k"):
        few_queries.attend_rows_in_blocks(q, k, k, [0, 2], 16, 20)


@needs_numba
@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("kept_last", [False, True])
def test_several_paged_sequences_attend_in_one_call_as_each_alone(block, kept_last):
    """compiled.paged_attention.attend_sequences: sequences of one pool with 1-8 new rows each (or,
    kept_last, only each one's last query row, as a pass's last layer keeps), their blocks
    interleaved in the pool: every sequence's new K and V land in its own blocks and its output is
    few_queries.attend_rows_in_blocks' for it alone, bit for bit; the other sequences' rows and
    blocks nobody holds stay as they were."""
    from tinydecoder.fast.compiled import paged_attention

    Hq, Hkv, d = 6, 2, 64
    rng = np.random.default_rng(block + kept_last)
    news, pasts = [3, 1, 8, 1, 5], [0, 40, 7, 129, 16]
    n_blocks = sum(-(-(p + s) // block) for p, s in zip(pasts, news)) + 4
    order = rng.permutation(n_blocks)
    tables, used = [], 0
    for p, s in zip(pasts, news):
        k = -(-(p + s) // block)
        tables.append(order[used:used + k])
        used += k
    k_rows = rng.standard_normal((n_blocks * block, Hkv, d)).astype(np.float32)
    v_rows = rng.standard_normal(k_rows.shape).astype(np.float32)
    k_new = rng.standard_normal((sum(news), Hkv, d)).astype(np.float32)
    v_new = rng.standard_normal(k_new.shape).astype(np.float32)
    kv_bounds = np.cumsum([0] + news)
    q_rows = [1] * len(news) if kept_last else news
    q = rng.standard_normal((sum(q_rows), Hq, d)).astype(np.float32)
    q_bounds = np.cumsum([0] + q_rows)
    padded = np.zeros((len(news), max(len(t) for t in tables)), np.int64)
    for s, t in enumerate(tables):
        padded[s, :len(t)] = t
    k_got, v_got = k_rows.copy(), v_rows.copy()
    got = paged_attention.attend_sequences(q, k_new, v_new, q_bounds, kv_bounds, k_got, v_got, padded, block, pasts)
    k_want, v_want = k_rows.copy(), v_rows.copy()
    for s, (p, n) in enumerate(zip(pasts, news)):
        at = np.array([tables[s][t // block] * block + t % block for t in range(p, p + n)])
        k_want[at], v_want[at] = k_new[kv_bounds[s]:kv_bounds[s + 1]], v_new[kv_bounds[s]:kv_bounds[s + 1]]
        alone = few_queries.attend_rows_in_blocks(q[q_bounds[s]:q_bounds[s + 1]], k_want, v_want, tables[s], block, p + n)
        np.testing.assert_array_equal(got[q_bounds[s]:q_bounds[s + 1]], alone)
    np.testing.assert_array_equal(k_got, k_want)
    np.testing.assert_array_equal(v_got, v_want)
    with pytest.raises(ValueError, match="block tables .* covering each sequence"):
        paged_attention.attend_sequences(q, k_new, v_new, q_bounds, kv_bounds, k_got, v_got, padded[:, :1], block, pasts)


@needs_numba
@pytest.mark.parametrize("block", [8, 16])
@pytest.mark.parametrize("S, T", [(9, 9), (20, 37), (64, 300)])
@pytest.mark.parametrize("d", [16, 64])
def test_prefill_attention_over_a_paged_caches_blocks_equals_the_gathered_cache_bit_for_bit(block, S, T, d):
    """prefill_attention.attend_prefill(blocks=...): a prefill chunk of S rows over T positions whose K
    and V lie in a pool's scattered blocks gives exactly the numbers of the positions gathered in
    order (its layout copies the same numbers into the same places); rows of other blocks are never
    read; a table that does not cover T is refused."""
    from tinydecoder.fast.compiled import prefill_attention

    Hq, Hkv = 9, 3
    rng = np.random.default_rng(block + S + T + d)
    n_blocks = -(-T // block)
    table = rng.permutation(2 * n_blocks + 1)[:n_blocks]
    k_rows = rng.standard_normal(((2 * n_blocks + 1) * block, Hkv, d)).astype(np.float32)
    v_rows = rng.standard_normal(k_rows.shape).astype(np.float32)
    q = rng.standard_normal((S, Hq, d)).astype(np.float32)
    at = np.array([table[t // block] * block + t % block for t in range(T)])
    want = prefill_attention.attend_prefill(q, np.ascontiguousarray(k_rows[at]), np.ascontiguousarray(v_rows[at]))
    others = np.setdiff1d(np.arange(len(k_rows)), at)
    k_rows[others], v_rows[others] = 1e3, -1e3  # never read
    got = prefill_attention.attend_prefill(q, k_rows, v_rows, blocks=(table, block, T))
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=rf"covering T.*T={T + block}"):
        prefill_attention.attend_prefill(q, k_rows, v_rows, blocks=(table, block, T + block))
