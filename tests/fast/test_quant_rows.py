"""fast.compiled.quant_rows: rows times GGUF Q4_1 / Q8_0 blocks read in place equals x @ dequantised(W).T."""
import numpy as np
import pytest

from tinydecoder.fast.compiled import jit
from tinydecoder.fast.compiled import quant_rows as qr

gguf_quants = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType  # noqa: E402

needs_numba = pytest.mark.skipif(not jit.available(), reason="needs the [fast] extra (numba, threadpoolctl)")
EPS = np.finfo(np.float32).eps


def halves(values) -> np.ndarray:
    """float16 values as their little-endian bytes [..., 2]."""
    v = np.asarray(values, "<f2")
    return v.view(np.uint8).reshape(*v.shape, 2)


def random_blocks(rng, N: int, K: int, kind: str) -> np.ndarray:
    """Distinct random blocks [N, K/32 * bytes]: scales of both signs, some zero, some subnormal."""
    nb = K // 32
    d = rng.uniform(-0.05, 0.05, (N, nb))
    d[rng.random((N, nb)) < 0.05] = 0.0
    d[rng.random((N, nb)) < 0.03] = 3e-6  # a float16 subnormal
    if kind == "Q4_1":
        raw = np.empty((N, nb, 20), np.uint8)
        raw[..., 0:2] = halves(d)
        raw[..., 2:4] = halves(rng.uniform(-0.4, 0.4, (N, nb)))
        raw[..., 4:] = rng.integers(0, 256, (N, nb, 16), dtype=np.uint8)
    else:
        raw = np.empty((N, nb, 34), np.uint8)
        raw[..., 0:2] = halves(d)
        raw[..., 2:] = rng.integers(0, 256, (N, nb, 32), dtype=np.uint8)
    return raw.reshape(N, -1)


def gguf_weights(raw, kind: str, K: int) -> np.ndarray:
    """The gguf package's own dequantisation: [N, K] float32."""
    return np.asarray(gguf_quants.dequantize(raw, GGMLQuantizationType[kind]), np.float32).reshape(-1, K)


def bound(x, raw, kind: str, K: int) -> np.ndarray:
    """A float32 rounding bound for x @ W.T: 4 sqrt(K) eps sum_k |x_k| (15 |d| + |m|) (Q8_0: 128 |d|)."""
    nb = K // 32
    blocks = raw.reshape(raw.shape[0], nb, -1)
    d = np.abs(blocks[..., 0:2].copy().view("<f2").astype(np.float64))
    if kind == "Q4_1":
        m = np.abs(blocks[..., 2:4].copy().view("<f2").astype(np.float64))
        mag = d * 15 + m
    else:
        mag = d * 128
    absw = np.repeat(mag[..., 0], 32, axis=1)  # [N, K]
    return 4 * K ** 0.5 * EPS * (np.abs(x).astype(np.float64) @ absw.T) + 1e-30


def test_dequantize_rows_equals_gguf_bit_for_bit():
    rng = np.random.default_rng(0)
    for kind in ("Q4_1", "Q8_0"):
        raw = random_blocks(rng, 7, 96, kind)
        w = qr.QuantMatrix.from_blocks(raw, kind, 96)
        assert np.array_equal(w.dequantize().T, gguf_weights(raw, kind, 96))
        assert np.array_equal(np.asarray(w), w.dequantize())
        assert np.array_equal(w.T[np.array([6, 0, 6])], gguf_weights(raw, kind, 96)[[6, 0, 6]])


@needs_numba
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("N,K", [(1, 32), (7, 64), (33, 576), (130, 2048), (250, 160)])
def test_rows_times_equals_dequantised_product(kind, N, K):
    rng = np.random.default_rng(N * 7 + K)
    raw = random_blocks(rng, N, K, kind)
    w = qr.QuantMatrix.from_blocks(raw, kind, K)
    W = gguf_weights(raw, kind, K).astype(np.float64)  # [N, K]
    for M in (1, 2, 3, 4, 5, 7, 8, 9, 13, 15, 16, 17, 40):  # 13 and 15: 8, then 4, then 1 or 3
        x = rng.standard_normal((M, K)).astype(np.float32)
        x[0, :32] = 0.0  # a block of zeros in the input
        out = qr.rows_times(x, w, np.full((M, N), np.nan, np.float32))
        err = np.abs(out - x.astype(np.float64) @ W.T)
        assert (err <= bound(x, raw, kind, K)).all(), (M, float(err.max()))


@needs_numba
def test_swapped_nibbles_are_caught():
    """The bound is tight enough to see a kernel that read the high nibble first."""
    rng = np.random.default_rng(5)
    K, N = 256, 40
    raw = random_blocks(rng, N, K, "Q4_1")
    swapped = raw.reshape(N, K // 32, 20).copy()
    swapped[..., 4:] = (swapped[..., 4:] >> 4) | (swapped[..., 4:] << 4)
    x = rng.standard_normal((3, K)).astype(np.float32)
    out = qr.rows_times(x, qr.QuantMatrix.from_blocks(raw, "Q4_1", K), np.empty((3, N), np.float32))
    wrong = x.astype(np.float64) @ gguf_weights(swapped.reshape(N, -1), "Q4_1", K).T.astype(np.float64)
    assert (np.abs(out - wrong) > bound(x, raw, "Q4_1", K)).mean() > 0.9


@needs_numba
@pytest.mark.parametrize("M", [1, 6, 20, 45])
@pytest.mark.parametrize("dense_from", [16, 10**6])  # many rows: dequantised whole then float32 tiles, or _tiles
def test_parts_write_their_own_columns(M, dense_from, monkeypatch):
    """Two tensors fused as parts, the first with its rows permuted (as Q/K are): column c of the
    product is the weight row named c."""
    monkeypatch.setattr(qr, "DENSE_FROM_ROWS", dense_from)
    rng = np.random.default_rng(M)
    K = 128
    a, b = random_blocks(rng, 12, K, "Q4_1"), random_blocks(rng, 5, K, "Q4_1")
    perm = rng.permutation(12)
    w = qr.QuantMatrix([(a, perm), (b, np.arange(12, 17))], "Q4_1", K)
    W = np.zeros((17, K))
    W[perm] = gguf_weights(a, "Q4_1", K)
    W[12:] = gguf_weights(b, "Q4_1", K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    out = qr.rows_times(x, w, np.empty((M, 17), np.float32))
    np.testing.assert_allclose(out, x @ W.T, rtol=0, atol=1e-4)
    assert np.array_equal(np.asarray(w), W.T.astype(np.float32))
    head = w[:, 12:]  # a whole part: the second tensor
    assert head.shape == (K, 5) and np.array_equal(np.asarray(head), gguf_weights(b, "Q4_1", K).T)
    with pytest.raises(ValueError, match="cut a part"):
        w[:, 3:14]


def test_bad_shapes_are_clear_errors():
    rng = np.random.default_rng(1)
    raw = random_blocks(rng, 4, 64, "Q4_1")
    with pytest.raises(ValueError, match="multiple of 32"):
        qr.QuantMatrix.from_blocks(raw, "Q4_1", 60)
    with pytest.raises(ValueError, match="uint8"):
        qr.QuantMatrix.from_blocks(raw, "Q4_1", 96)  # rows of 40 bytes are not 3 blocks
    with pytest.raises(ValueError, match="kind"):
        qr.QuantMatrix.from_blocks(raw, "Q5_0", 64)
    w = qr.QuantMatrix.from_blocks(raw, "Q4_1", 64)
    with pytest.raises(ValueError, match=r"float32 x \[M, 64\]"):
        qr.rows_times(np.zeros((2, 32), np.float32), w, np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"float32 x"):
        qr.rows_times(np.zeros((2, 64)), w, np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="out of shape"):
        qr.rows_times(np.zeros((2, 64), np.float32), w, np.empty((2, 5), np.float32))
    with pytest.raises(ValueError, match="table view"):
        qr.rows_times(np.zeros((2, 64), np.float32), w.T, np.empty((2, 4), np.float32))
    with pytest.raises(IndexError):
        w.T[np.array([4])]


_KERNELS = {}  # (maker, its arguments) -> the compiled caller, shared by the K below


@needs_numba
@pytest.mark.parametrize("table", [False, True])
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("K", [32, 96, 160, 576])
def test_both_ways_of_reading_q4_1_blocks_give_the_product(kind, table, K):
    """quant_dots' kernels, each compiled both ways whatever this machine picks (TABLE): blocks
    converted to floats, or Q4_1 weights picked from a table of 16 (AVX-512 only); R input rows
    against one output row (make_dots: 1-4 rows, UNROLL blocks in flight and a tail) and 1-4 input
    rows and 8 against OUTPUTS output rows (make_outputs; by table also with d and m read from
    float32 scales, the same numbers), on distinct random blocks."""
    from tinydecoder.fast.compiled import quant_dots as qd

    if table and (kind != "Q4_1" or not qd.has_avx512()):
        pytest.skip("the table is read with AVX-512's vpermps, for Q4_1 blocks")
    import numba

    rng = np.random.default_rng(K + 7 * table)
    O = qd.OUTPUTS
    raw = random_blocks(rng, O, K, kind)
    W = gguf_weights(raw, kind, K).astype(np.float64)  # [O, K]
    x = rng.standard_normal((8, K)).astype(np.float32)
    sx = x.reshape(8, -1, 32).sum(axis=2, dtype=np.float32)
    flat = raw.reshape(-1)

    def compiled(make, *args):  # a compiled function that calls the intrinsic at offsets 0, once for every K
        if (make, args) not in _KERNELS:
            intrinsic = make(*args)
            if make is qd.make_outputs:  # the blocks' float32 scales too
                _KERNELS[make, args] = numba.njit(lambda raw, x, K, sx, dm, acc: intrinsic(raw, 0, x, 0, K, sx, 0, dm, 0, acc))
            else:
                _KERNELS[make, args] = numba.njit(lambda raw, x, K, sx, acc: intrinsic(raw, 0, x, 0, K, sx, 0, acc))
        return _KERNELS[make, args]

    dm = qr.block_scales(raw) if table else np.zeros((0, 0), np.float32)  # read by table only

    alone = {}
    for R in (1, 2, 3, 4):
        dots = compiled(qd.make_dots, kind, R, table)
        acc = np.full((R, 33), np.nan, np.float32)
        dots(flat, x, K, sx, acc)
        got = acc[:, :32].astype(np.float64).sum(axis=1) + acc[:, 32]
        err = np.abs(got - x[:R].astype(np.float64) @ W[0])
        assert (err <= bound(x[:R], raw[:1], kind, K)[:, 0]).all(), (R, err)
    from_blocks = {}
    for R in (1, 2, 3, 4, 8):
        for pair in (False, True):  # one output row at a time, or two side by side
            for scales in (False, True) if table else (False,):  # d and m from the blocks, or from `dm`
                outputs = compiled(qd.make_outputs, kind, O, table, R, pair, scales)
                acc = np.full(O * R, np.nan, np.float32)
                outputs(flat, x, K, sx, dm, acc)
                err = np.abs(acc.reshape(O, R) - W @ x[:R].T.astype(np.float64))
                assert (err <= bound(x[:R], raw, kind, K).T).all(), (R, pair, scales, err)
                if scales:  # the same numbers as with d and m read from the blocks
                    assert np.array_equal(acc, from_blocks[R, pair]), (R, pair)
                else:
                    from_blocks[R, pair] = acc.copy()
                if pair and R <= 4:  # the same sums in the same order as one at a time
                    assert np.array_equal(acc, alone[R]), R
                if not pair:
                    alone[R] = acc.copy()
                if scales:  # the scales are what it reads: doubled d's, other products
                    doubled = dm.copy()
                    doubled[:, 0::2] *= 2
                    outputs(flat, x, K, sx, doubled, acc)
                    assert not np.allclose(acc.reshape(O, R), W @ x[:R].T.astype(np.float64), rtol=1e-3, atol=1e-3)


def test_scales_are_the_blocks_float16_d_and_m_made_once():
    """quant_rows.scales: a Q4_1 matrix's (d, m) per block as float32, equal to the file's float16s,
    made on first use and kept; a Q8_0 matrix (or one read without the table) gets placeholders."""
    rng = np.random.default_rng(11)
    raw = random_blocks(rng, 6, 96, "Q4_1")
    w = qr.QuantMatrix([(raw[:4], np.array([1, 0, 3, 2])), (raw[4:], np.array([5, 4]))], "Q4_1", 96)
    blocks = raw.reshape(6, 3, 20)
    d, m = (blocks[..., a:a + 2].copy().view("<f2")[..., 0].astype(np.float32) for a in (0, 2))
    got = qr.block_scales(raw)
    assert got.dtype == np.float32 and got.shape == (6, 6)
    assert np.array_equal(got[:, 0::2], d) and np.array_equal(got[:, 1::2], m)
    if not jit.available():
        return
    from tinydecoder.fast.compiled import quant_dots as qd

    first = qr.scales(w)
    assert qr.scales(w) is first  # kept with the matrix
    if qd.TABLE:
        assert [s.shape for s in first] == [(4, 6), (2, 6)] and np.array_equal(first[1], got[4:])
    else:
        assert all(s.size == 0 for s in first)
    q80 = qr.QuantMatrix.from_blocks(random_blocks(rng, 3, 64, "Q8_0"), "Q8_0", 64)
    assert [s.size for s in qr.scales(q80)] == [0]


def test_outputs_pair_takes_output_rows_two_at_a_time():
    from tinydecoder.fast.compiled import jit

    if not jit.available():
        pytest.skip("needs numba")
    from tinydecoder.fast.compiled import quant_dots as qd

    with pytest.raises(ValueError, match="pair takes output rows two at a time, not O = 3"):
        qd.make_outputs("Q8_0", 3, False, 4, pair=True)
