"""fast.compiled.quant_planes: one row times Q4_1 blocks laid out in bit planes, by table lookups,
equals x @ dequantised(W).T up to float32 rounding, on distinct random blocks (scales of both signs,
zero and subnormal ones), fused parts writing permuted columns; the compiled packing equals the
numpy one, and the numpy one is checked against the file's codes by unpacking it here."""
import numpy as np
import pytest
from test_quant_rows import bound, gguf_weights, random_blocks

from tinydecoder.fast.compiled import jit, quant_planes, quant_rows
from tinydecoder.fast.compiled.quant_matrix import QuantMatrix

needs_numba = pytest.mark.skipif(not jit.available(), reason="needs the [fast] extra (numba, threadpoolctl)")


def unpack(planes: np.ndarray, N: int) -> tuple:
    """The planes back to the rows' codes [N, K] and float16 d, m [N, K/32], bit by bit (the module
    docstring's layout, read independently of pack_reference's code)."""
    G, nb, _ = planes.shape
    words = planes[..., :256].copy().view("<u4").reshape(G, nb, 4, 16)  # [G, nb, plane, row]
    codes = np.zeros((N, nb * 32), np.int64)
    for g in range(G):
        for b in range(nb):
            for p in range(4):
                for r in range(16):
                    for k in range(32):  # weight k: nibble k // 4, bit k % 4 of plane p's word
                        codes[16 * g + r, 32 * b + k] |= ((int(words[g, b, p, r]) >> k) & 1) << p
    dm = planes[..., 256:].copy().view("<f2").reshape(G, nb, 2, 16)
    d = dm[:, :, 0].transpose(0, 2, 1).reshape(N, nb)
    m = dm[:, :, 1].transpose(0, 2, 1).reshape(N, nb)
    return codes, d, m


def test_pack_reference_holds_each_rows_codes_and_scales():
    rng = np.random.default_rng(0)
    N, K = 32, 64
    raw = random_blocks(rng, N, K, "Q4_1")
    codes, d, m = unpack(quant_planes.pack_reference(raw), N)
    blocks = raw.reshape(N, K // 32, 20)
    want = np.concatenate([blocks[..., 4:] & 15, blocks[..., 4:] >> 4], axis=-1).reshape(N, K)
    assert np.array_equal(codes, want)
    assert np.array_equal(d.view(np.uint16), blocks[..., 0:2].copy().view("<u2")[..., 0])
    assert np.array_equal(m.view(np.uint16), blocks[..., 2:4].copy().view("<u2")[..., 0])


@needs_numba
@pytest.mark.parametrize("N,K", [(16, 32), (48, 96), (160, 576)])
def test_compiled_pack_equals_the_reference(N, K):
    raw = random_blocks(np.random.default_rng(N + K), N, K, "Q4_1")
    assert np.array_equal(quant_planes.pack(raw), quant_planes.pack_reference(raw))


@needs_numba
@pytest.mark.skipif(not jit.available() or not quant_planes.applies(QuantMatrix.from_blocks(
    np.zeros((16, 20), np.uint8), "Q4_1", 32)), reason="needs AVX-512 (vpermps on 16 lanes)")
@pytest.mark.parametrize("N,K", [(16, 32), (48, 96), (160, 576), (64, 1536)])
def test_one_row_by_lookup_equals_the_dequantised_product(N, K):
    rng = np.random.default_rng(7 * N + K)
    raw = random_blocks(rng, N, K, "Q4_1")
    w = QuantMatrix.from_blocks(raw, "Q4_1", K)
    x = rng.normal(0, 1, (1, K)).astype(np.float32)
    x[0, rng.random(K) < 0.1] = 0.0
    out = quant_planes.product(x, w, np.empty((1, N), np.float32))
    want = x.astype(np.float64) @ gguf_weights(raw, "Q4_1", K).astype(np.float64).T
    assert np.all(np.abs(out - want) <= bound(x, raw, "Q4_1", K))
    assert isinstance(w._planes, tuple)  # packed once, kept with the matrix
    again = quant_planes.product(x, w, np.empty((1, N), np.float32))
    assert np.array_equal(again, out)
    x2 = np.concatenate([rng.normal(0, 3, (1, K)).astype(np.float32), x])  # two rows share the planes' indices
    both = quant_planes.product(x2, w, np.empty((2, N), np.float32))
    assert np.array_equal(both[1], out[0])  # each row's numbers are its own alone, bit for bit
    alone = quant_planes.product(x2[:1], w, np.empty((1, N), np.float32))
    assert np.array_equal(both[0], alone[0])
    want2 = x2.astype(np.float64) @ gguf_weights(raw, "Q4_1", K).astype(np.float64).T
    assert np.all(np.abs(both - want2) <= bound(x2, raw, "Q4_1", K))


@needs_numba
def test_parts_write_their_own_columns_and_quant_rows_decodes_by_lookup():
    rng = np.random.default_rng(3)
    K = 96
    parts = [(random_blocks(rng, 48, K, "Q4_1"), rng.permutation(48)),
             (random_blocks(rng, 32, K, "Q4_1"), 48 + rng.permutation(32))]
    w = QuantMatrix(parts, "Q4_1", K)
    dense = np.zeros((K, 80))
    for raw, cols in parts:
        dense[:, cols] = gguf_weights(raw, "Q4_1", K).T
    x = rng.normal(0, 1, (1, K)).astype(np.float32)
    out = quant_rows.rows_times(x, w, np.empty((1, 80), np.float32))
    want = x.astype(np.float64) @ dense
    tol = np.zeros(80)
    for raw, cols in parts:
        tol[cols] = bound(x, raw, "Q4_1", K)[0]
    assert np.all(np.abs(out[0] - want[0]) <= tol)
    assert (w._planes is not False) == quant_planes.applies(w)  # one row asked for the planes where they apply
    two = quant_rows.rows_times(np.repeat(x, 2, axis=0), w, np.empty((2, 80), np.float32))  # the blocks' kernels
    assert np.all(np.abs(two - want) <= tol)


def test_planes_apply_to_one_row_of_whole_groups_of_q4_1_rows():
    rng = np.random.default_rng(1)
    q41 = QuantMatrix.from_blocks(random_blocks(rng, 32, 64, "Q4_1"), "Q4_1", 64)
    assert not quant_planes.applies(q41, rows=quant_planes.ROWS_UP_TO + 1) and not quant_planes.applies(q41, rows=0)
    assert not quant_planes.applies(q41.T)
    assert not quant_planes.applies(QuantMatrix.from_blocks(random_blocks(rng, 32, 64, "Q8_0"), "Q8_0", 64))
    assert not quant_planes.applies(QuantMatrix.from_blocks(random_blocks(rng, 24, 64, "Q4_1"), "Q4_1", 64))
    assert quant_planes.planes(QuantMatrix.from_blocks(random_blocks(rng, 24, 64, "Q4_1"), "Q4_1", 64)) is None
    if jit.available():
        from tinydecoder.fast.compiled import quant_dots

        assert quant_planes.applies(q41) == quant_dots.TABLE


def test_product_refuses_what_it_does_not_take():
    rng = np.random.default_rng(2)
    q80 = QuantMatrix.from_blocks(random_blocks(rng, 32, 64, "Q8_0"), "Q8_0", 64)
    with pytest.raises(ValueError, match="1-2 rows times a Q4_1 QuantMatrix"):
        quant_planes.product(np.zeros((1, 64), np.float32), q80, np.empty((1, 32), np.float32))
    q41 = QuantMatrix.from_blocks(random_blocks(rng, 32, 64, "Q4_1"), "Q4_1", 64)
    with pytest.raises(ValueError, match="got 3 rows"):
        quant_planes.product(np.zeros((3, 64), np.float32), q41, np.empty((3, 32), np.float32))


def test_the_lessons_lookup_is_the_dot_product_and_the_kernels_table():
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, 32).astype(np.float32)
    codes = rng.integers(0, 16, 32)
    assert quant_planes.plane_index([5, 3, 12, 7], 2) == 0b1101  # bits 2 of 5, 3, 12, 7: 1, 0, 1, 1
    assert np.isclose(quant_planes.dot_by_lookup(codes, x), float(codes @ x.astype(np.float64)), rtol=0,
                      atol=64 * np.finfo(np.float32).eps * float(np.abs(codes * x).sum()))
    table = quant_planes.subset_sums(x[:4])
    assert table[0] == 0 and table[15] == (x[0] + x[1]) + (x[2] + x[3]) and table[6] == x[1] + x[2]
    if jit.available():  # the compiled tables are these, bit for bit
        T, sx = np.empty((8, 16), np.float32), np.empty(1, np.float32)
        jit._bind(quant_planes.__dict__)
        quant_planes._tables(x[None], T, sx)
        assert np.array_equal(T, np.stack([quant_planes.subset_sums(x[k:k + 4]) for k in range(0, 32, 4)]))
