"""fast/fused_quant.py: the one-call decoder block for layers whose matrices are GGUF Q4_1 / Q8_0
blocks (QuantMatrix). It runs the kernels the unfused quantised path runs, in the same order, so
its logits and cached K/V must equal that path's up to float32's last bits, and the reference
forward on the dequantised weights up to float32 rounding. Checked on a toy with distinct random
blocks (Q4_1 and Q8_0 matrices, fused parts writing permuted columns), 1-8 new rows after 0, 7
and 130 cached positions (a cache that grows), both RoPE layouts."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core import reference
from tinydecoder.core.model import LayerWeights, Model
from tinydecoder.fast import forward_pass as fast
from tinydecoder.fast import fused_quant
from tinydecoder.fast.compiled import jit, quant_planes, quant_rows
from tinydecoder.fast.compiled.quant_rows import QuantMatrix

pytestmark = pytest.mark.skipif(not jit.available(), reason="numba is not installed (the [fast] extra)")


def config(layout="halves"):
    return td.Config(vocab_size=61, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, n_layers=3, d_ff=96,
                     max_context=200, position="rope", norm_eps=1e-5, rope_layout=layout, tied_embeddings=True,
                     name="fused-quant-test")


def blocks(rng, N, K, kind):
    """Distinct random blocks [N, K/32 * bytes] (scales of both signs, as a GGUF file holds them)."""
    nb = K // 32
    d = rng.uniform(-0.04, 0.04, (N, nb)).astype("<f2").view(np.uint8).reshape(N, nb, 2)
    if kind == "Q4_1":
        m = rng.uniform(-0.3, 0.3, (N, nb)).astype("<f2").view(np.uint8).reshape(N, nb, 2)
        raw = np.concatenate([d, m, rng.integers(0, 256, (N, nb, 16), dtype=np.uint8)], axis=2)
    else:
        raw = np.concatenate([d, rng.integers(0, 256, (N, nb, 32), dtype=np.uint8)], axis=2)
    return np.ascontiguousarray(raw.reshape(N, -1))


def quant_model(cfg, seed=3):
    rng = np.random.default_rng(seed)
    D, F, Hq, Hkv, d = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    layers = []
    for l in range(cfg.n_layers):
        kind = "Q4_1" if l != 1 else "Q8_0"
        q_cols = rng.permutation(Hq * d)  # Q's rows write their outputs out of order, as llama.cpp's do
        layers.append(LayerWeights(
            w_qkv=QuantMatrix([(blocks(rng, Hq * d, D, kind), q_cols),
                               (blocks(rng, Hkv * d, D, kind), Hq * d + np.arange(Hkv * d)),
                               (blocks(rng, Hkv * d, D, kind), (Hq + Hkv) * d + np.arange(Hkv * d))], kind, D),
            wo=QuantMatrix.from_blocks(blocks(rng, D, Hq * d, kind), kind, Hq * d),
            w_gate_up=QuantMatrix([(blocks(rng, F, D, kind), np.arange(F)),
                                   (blocks(rng, F, D, kind), F + np.arange(F))], kind, D),
            w_down=QuantMatrix.from_blocks(blocks(rng, D, F, "Q8_0"), "Q8_0", F),
            attn_norm=rng.uniform(0.5, 1.5, D).astype(np.float32), ffn_norm=rng.uniform(0.5, 1.5, D).astype(np.float32)))
    embed = rng.normal(0, 1, (cfg.vocab_size, D)).astype(np.float32)
    return Model(cfg, embed=embed, layers=layers, final_norm=rng.uniform(0.5, 1.5, D).astype(np.float32),
                 lm_head=None)


def dequantised(model):
    """The same model with every QuantMatrix as its float32 numbers (nothing shared)."""
    layers = [LayerWeights(**{k: np.array(np.asarray(v), np.float32) for k, v in layer.arrays().items()})
              for layer in model.layers]
    return Model(model.config, embed=model.embed.copy(), layers=layers, final_norm=model.final_norm.copy(),
                 lm_head=None)


@pytest.fixture
def layers_run(fused_layers_of):
    """The rows of each layer fused_quant.run_layers ran (all of them in one call)."""
    return fused_layers_of(fused_quant)


def tokens(n, seed):
    return np.random.default_rng(seed).integers(0, 61, n).tolist()


@pytest.mark.parametrize("layout", ["halves", "interleaved"])
@pytest.mark.parametrize("past", [0, 7, 130])
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_a_fused_quant_pass_equals_the_unfused_kernels(layout, past, rows, layers_run, monkeypatch):
    model = quant_model(config(layout))
    ids = tokens(past + rows, seed=past + rows)
    first = model.new_cache(past + 1)
    if past:
        fast.forward(model, ids[:past], first, last_only=True)
    caches = [first, first.copy(rows)]  # both passes start from the same cached rows
    before = [a[:past].copy() for a in first.k + first.v]
    layers_run.clear()
    got = fast.forward(model, ids[past:], caches[0])
    assert layers_run == [rows] * model.config.n_layers  # every layer ran fused
    with monkeypatch.context() as m:
        m.setattr(fused_quant, "run_layers", lambda *a: 0)  # no layer runs fused: each one `_block`
        want = fast.forward(model, ids[past:], caches[1])
    assert len(layers_run) == model.config.n_layers  # the unfused pass did not
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    for a, b, old in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v, before):
        assert np.array_equal(a[:past], old) and np.array_equal(b[:past], old)  # the cached rows stay as they were
        np.testing.assert_allclose(a[past:past + rows], b[past:past + rows], rtol=0, atol=1e-5 * np.abs(b).max())


def test_fused_quant_decode_equals_the_reference_on_dequantised_weights(layers_run):
    model = quant_model(config())
    ids = tokens(60, seed=1)
    want = reference.forward(dequantised(model), ids)
    cache = model.new_cache(8)
    np.testing.assert_allclose(fast.forward(model, ids[:40], cache), want[:40], rtol=0,
                               atol=2e-4 * np.abs(want).max())
    at = 40
    for n in (1, 3, 1, 8, 1, 6):
        layers_run.clear()
        got = fast.forward(model, ids[at:at + n], cache)
        np.testing.assert_allclose(got, want[at:at + n], rtol=0, atol=2e-4 * np.abs(want).max())
        assert layers_run == [n] * model.config.n_layers
        at += n


def test_fits_only_quant_layers_of_few_rows():
    model = quant_model(config())
    rows = quant_rows.ROWS_UP_TO
    assert fused_quant.fits(model.layers[0], 1) and fused_quant.fits(model.layers[0], rows)
    assert not fused_quant.fits(model.layers[0], rows + 1)
    assert not fused_quant.fits(dequantised(model).layers[0], 1)


@pytest.mark.parametrize("rows", [1, 2])
def test_a_decode_step_reads_q4_1_layers_by_lookup_and_agrees_with_their_blocks(layers_run, rows):
    """A decode step (or a check of one guess: quant_planes.ROWS_UP_TO rows) by lookup."""
    model, same = quant_model(config()), quant_model(config())  # the same blocks, twice
    ids = tokens(29 + rows, seed=4)
    cache = model.new_cache(40)
    fast.forward(model, ids[:29], cache)

    def q41(m):
        return [w for layer in m.layers for w in (layer.w_qkv, layer.wo, layer.w_gate_up, layer.w_down)
                if w.kind == "Q4_1"]

    assert all(w._planes is None for w in q41(model))  # a prefill does not ask for planes
    for w in q41(same):
        w._planes = False  # as where planes do not apply: the file's blocks
    by_blocks = fast.forward(same, ids[29:], cache.copy(rows))
    q41 = q41(model)
    layers_run.clear()
    by_lookup = fast.forward(model, ids[29:], cache)
    assert layers_run == [rows] * model.config.n_layers  # each layer one fused call, its products by `_product`
    assert all(isinstance(w._planes, tuple) == quant_planes.applies(w) for w in q41)
    assert any(w._planes for w in q41) or not quant_planes.applies(q41[0])
    np.testing.assert_allclose(by_lookup, by_blocks, rtol=0, atol=1e-5 * np.abs(by_blocks).max())
