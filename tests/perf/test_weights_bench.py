"""perf/weights_bench: one network held two ways (float32 and GGUF Q4_1 blocks), timed in turn.
Checked on a small model and its dequantised twin (no wall-time asserts): the section's keys, the
bytes a step reads (blocks against float32), batch decode for the first model only, the target's
arithmetic and the table's lines."""
import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.core.model import LayerWeights, Model
from tinydecoder.fast.compiled import jit
from tinydecoder.fast.compiled.quant_rows import QuantMatrix
from tinydecoder.perf import weights_bench as wb


def blocks(rng, N, K):
    nb = K // 32
    d = rng.uniform(-0.04, 0.04, (N, nb)).astype("<f2").view(np.uint8).reshape(N, nb, 2)
    m = rng.uniform(-0.3, 0.3, (N, nb)).astype("<f2").view(np.uint8).reshape(N, nb, 2)
    return np.ascontiguousarray(np.concatenate([d, m, rng.integers(0, 256, (N, nb, 16), dtype=np.uint8)], 2)
                                .reshape(N, -1))


def twins():
    """(a Q4_1 model, the same numbers as float32 out-major matrices)."""
    cfg = td.Config(vocab_size=50, d_model=64, n_heads=2, n_kv_heads=1, head_dim=32, n_layers=2, d_ff=64,
                    max_context=300, position="rope", norm_eps=1e-5, rope_layout="halves", tied_embeddings=True,
                    name="weights-bench-test")
    rng = np.random.default_rng(0)
    D = cfg.d_model
    def qkv():  # Q, K and V as parts: a last-only pass splits Q from K and V
        return QuantMatrix([(blocks(rng, n, D), a + np.arange(n)) for a, n in ((0, 64), (64, 32), (96, 32))], "Q4_1", D)

    layers = [LayerWeights(w_qkv=qkv(),
                           wo=QuantMatrix.from_blocks(blocks(rng, D, 64), "Q4_1", 64),
                           w_gate_up=QuantMatrix.from_blocks(blocks(rng, 128, D), "Q4_1", D),
                           w_down=QuantMatrix.from_blocks(blocks(rng, D, 64), "Q4_1", 64),
                           attn_norm=np.ones(D, np.float32), ffn_norm=np.ones(D, np.float32)) for _ in range(2)]
    embed = rng.normal(0, 1, (cfg.vocab_size, D)).astype(np.float32)
    q = Model(cfg, embed=embed, layers=layers, final_norm=np.ones(D, np.float32), lm_head=None)
    dense = [LayerWeights(**{k: np.asfortranarray(np.asarray(v), np.float32) for k, v in layer.arrays().items()})
             for layer in layers]
    return q, Model(cfg, embed=embed.copy(), layers=dense, final_norm=np.ones(D, np.float32), lm_head=None)


@pytest.mark.skipif(not jit.available(), reason="the Q4_1 products need numba")
def test_compare_weights_reports_both_and_batch_for_the_first():
    q, f = twins()
    section = wb.compare_weights({"q4_1": q, "f32": f}, decode_contexts=(8, 32), lengths=(16,), rounds=2, steps=2,
                                 batch_sizes=(1, 2), batch_context=8, bandwidth_bytes=2**20, peak_gflops=120.0)
    assert list(section) == ["q4_1", "f32"]
    # per layer: QKV 64 x 128, output 64 x 64, gate and up 64 x 128, down 64 x 64; the head 64 x 50
    assert wb.matmul_weights(q) == wb.matmul_weights(f) == 2 * (8192 + 4096 + 8192 + 4096) + 64 * 50
    for name, model in (("q4_1", q), ("f32", f)):
        s = section[name]
        assert s["weights_bytes"] == model.nbytes
        for key in ("decode_tokens_per_second", "decode_roof_fraction", "decode_bandwidth_gbps"):
            assert set(s[key]) == {"8", "32"} and all(v > 0 for v in s[key].values())
        kv = model.config.kv_bytes_per_token(4)
        assert s["decode_bytes_per_token"] == {str(c): model.nbytes + (c + 1) * kv for c in (8, 32)}
        assert set(s["prefill_tokens_per_second"]) == {"16"} and s["prefill_tokens_per_second"]["16"] > 0
        assert set(s["pass_cost"]) == {"2", "3", "4", "8"} and all(v > 0 for v in s["pass_cost"].values())
        step = 1 / s["decode_tokens_per_second"]["8"]  # the floor, in this model's steps at the batch context
        assert s["pass_floor"] == {str(n): pytest.approx(2 * n * wb.matmul_weights(model) / 120e9 / step)  # the FMA roof
                                   for n in (2, 3, 4, 8)}
    layer_bytes = {name: sum(w.nbytes for w in (m.layers[0].w_qkv, m.layers[0].wo)) for name, m in (("q4_1", q),
                                                                                                  ("f32", f))}
    assert layer_bytes["q4_1"] * 128 == layer_bytes["f32"] * 20  # 20 bytes a block of 32 against 4 bytes a weight
    assert [row["batch"] for row in section["q4_1"]["batch_decode"]] == [1, 2]
    assert "batch_decode" not in section["f32"]


def test_weights_target_is_q4_1_over_f32_at_128():
    def side(tps, share):
        return {"decode_tokens_per_second": {"128": tps, "512": 1.0}, "decode_roof_fraction": {"128": share}}

    got = wb.weights_targets({"q4_1": side(150.0, 0.42), "f32": side(60.0, 0.8)})
    assert got == {"q4_1 decode at context 128 over f32 (q4_1 at 42% of the roof)":
                   {"measured": 2.5, "target": ">= 2.5", "met": True}}
    (t,) = wb.weights_targets({"q4_1": side(149.0, 0.42), "f32": side(60.0, 0.8)}).values()
    assert t["measured"] == pytest.approx(149 / 60) and not t["met"]
    assert wb.weights_targets({"f32": side(60.0, 0.8)}) == {} and wb.weights_targets(None) == {}


def test_weights_targets_cost_q4_1_passes_beside_their_floor():
    q = {"decode_tokens_per_second": {"128": 250.0}, "decode_roof_fraction": {"128": 0.4},
         "pass_cost": {"2": 1.3, "8": 3.6}, "pass_floor": {"2": 0.7, "8": 2.8}}
    got = wb.weights_targets({"q4_1": q})  # no f32: the passes alone
    assert got == {"q4_1 pass over 2 rows, in its decode steps, arithmetic floor 0.70":
                   {"measured": 1.3, "target": "<= 1.5", "met": True},
                   "q4_1 pass over 8 rows, in its decode steps, arithmetic floor 2.80":
                   {"measured": 3.6, "target": "<= 1.5", "met": False}}
    del q["pass_floor"]
    assert list(wb.weights_targets({"q4_1": q})) == ["q4_1 pass over 2 rows, in its decode steps",
                                                      "q4_1 pass over 8 rows, in its decode steps"]


def test_format_weights_lines():
    s = {"decode_tokens_per_second": {"128": 150.0}, "decode_roof_fraction": {"128": 0.4},
         "decode_bytes_per_token": {"128": 97e6}, "prefill_tokens_per_second": {"128": 900.0},
         "batch_decode": [{"batch": 4, "tokens_per_second": 300.0}],
         "pass_cost": {"2": 1.31, "8": 3.57}, "pass_floor": {"2": 0.62, "8": 2.49}}
    f32 = {**s, "pass_cost": {"2": 1.04}, "pass_floor": {}, "batch_decode": []}
    lines = wb.format_weights({"q4_1": s, "f32": f32})
    assert "q4_1 decode: ctx 128 150.0 tok/s (40% roof, 97.0 MB)" in "\n".join(lines)
    assert any(line.endswith("q4_1 a pass over n rows, in its decode steps: 2 rows 1.31 (floor 0.62)  8 rows 3.57 "
                             "(floor 2.49)") for line in lines)
    assert any(line.endswith("f32 a pass over n rows, in its decode steps: 2 rows 1.04") for line in lines)
    assert any("q4_1 batch   4: 300.0 tok/s" in line for line in lines)
    assert not any("price" in line for line in lines)
    priced = wb.format_weights({"q4_1": {**s, "price": {"tokens": 256, "perplexity": 10.002, "reference_perplexity": 10.0,
                                                         "mean_kl": 3.2e-11}}})
    assert any(line.endswith("q4_1 price: perplexity of 256 tokens fed as decode steps 10.0020 against float32's "
                             "10.0000 (+0.0200 %), mean KL 3.2e-11 nats a token") for line in priced)
    assert wb.format_weights(None) == [] and wb.format_weights({}) == []


def test_a_rounds_prefill_is_the_median_of_prefill_repeat_runs(monkeypatch):
    """Each round's prefill speed is the median of PREFILL_REPEAT timed prefills into fresh caches
    (a fake clock: the median, not the first or the mean)."""
    model = twins()[1]
    ran = []

    def fake_run_times(fn, repeat=5, warmup=1, after=None, before=None):
        assert warmup == 0
        for _ in range(repeat):
            fn()
            ran.append(1)
        return [0.5, 0.1, 0.2, 0.4][:repeat]

    monkeypatch.setattr(wb, "run_times", fake_run_times)
    monkeypatch.setattr(wb, "PREFILL_REPEAT", 3)
    assert wb._prefill_seconds(model, 6) == pytest.approx(0.2)
    assert len(ran) == 3
