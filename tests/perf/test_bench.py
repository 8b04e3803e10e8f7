"""The roofline's arithmetic (exact, on the toy model) and the bench CLI's output (no speeds)."""
import json

import numpy as np
import pytest

from tinydecoder import SEED_PROMPT, Trace, forward, forward_each, toy_model
from tinydecoder.cli import load_bench_model
from tinydecoder.cli import main as cli_main
from tinydecoder.perf import roofline
from tinydecoder.perf.bench import (
    attainable_gflops,
    batch_decode_speed,
    decode_speed,
    median_seconds,
    prefill_speed,
    ridge_point,
    run_bench,
    toy_bench_model,
)
from tinydecoder.perf.roofline import layer_intensities, op_cost, predicted_seconds, traced


@pytest.fixture(scope="module")
def toy():
    return toy_model()  # float64: 8 bytes a number


def toy_traces(model):
    cache = model.new_cache()
    prefill, decode = Trace(), Trace()
    forward(model, SEED_PROMPT, cache, trace=prefill)  # 4 rows, every position's logits
    forward(model, [3], cache, trace=decode)  # 1 row after 4 cached
    return prefill, decode


def test_toy_prefill_intensities_exact(toy):
    """Seed toy, prompt of 4 tokens, float64. A matmul x[M,K] @ w[K,N] moves (MK + KN + MN) * 8 bytes."""
    prefill, _ = toy_traces(toy)
    got = layer_intensities(prefill, itemsize=8, layer=0)
    want = {  # op: (FLOPs, bytes)
        "q_proj": (2 * 4 * 8 * 8, (32 + 64 + 32) * 8),  # 512, 1024
        "k_proj": (2 * 4 * 8 * 4, (32 + 32 + 16) * 8),  # 256, 640
        "v_proj": (256, 640),
        "attention": (4 * 2 * 4 * 4 * 4, (32 + 16 + 16 + 32) * 8),  # q [4,2,4], K, V [4,1,4], out [4,8]
        "o_proj": (512, 1024),
        "ffn_gate": (2 * 4 * 8 * 16, (32 + 128 + 64) * 8),  # 1024, 1792
        "ffn_up": (1024, 1792),
        "ffn_down": (2 * 4 * 16 * 8, (64 + 128 + 32) * 8),
        "lm_head": (2 * 4 * 8 * 6, (32 + 48 + 24) * 8),  # 384, 832
    }
    assert list(got) == list(want)  # execution order, FLOP-carrying ops only
    for op, (flops, moved) in want.items():
        assert (got[op]["flops"], got[op]["bytes"]) == (flops, moved), op
        assert got[op]["intensity"] == pytest.approx(flops / moved)
    assert got["q_proj"]["intensity"] == 0.5 and got["attention"]["intensity"] == pytest.approx(2 / 3)


def test_toy_decode_intensities_exact_and_lower(toy):
    prefill, decode = toy_traces(toy)
    got = layer_intensities(decode, itemsize=8, layer=1)
    assert (got["q_proj"]["flops"], got["q_proj"]["bytes"]) == (128, (8 + 64 + 8) * 8)  # 0.2 FLOP/byte
    assert (got["attention"]["flops"], got["attention"]["bytes"]) == (4 * 2 * 1 * 5 * 4, (8 + 20 + 20 + 8) * 8)
    assert (got["ffn_down"]["flops"], got["ffn_down"]["bytes"]) == (2 * 16 * 8, (16 + 128 + 8) * 8)
    pre = layer_intensities(prefill, itemsize=8, layer=1)
    for op in got:  # one row instead of four: every op of decode is less intense
        assert got[op]["intensity"] < pre[op]["intensity"], op


def test_batching_raises_matmul_intensity_but_not_attention(toy):
    caches = [toy.new_cache() for _ in range(4)]
    for c in caches:
        forward(toy, SEED_PROMPT, c)
    one = layer_intensities(traced(toy, [[3]], caches[:1]), 8)
    four = layer_intensities(traced(toy, [[3]] * 4, caches), 8)
    assert four["q_proj"]["flops"] == 4 * one["q_proj"]["flops"]
    assert four["q_proj"]["bytes"] == (4 * 8 + 64 + 4 * 8) * 8  # the weight is read once for all four
    assert (one["q_proj"]["intensity"], four["q_proj"]["intensity"]) == (0.2, 0.5)
    assert four["attention"]["intensity"] == pytest.approx(one["attention"]["intensity"])  # each reads its own K/V
    assert all(len(c) == 4 for c in caches)  # traced() worked on copies


def test_op_cost_of_elementwise_and_embed_ops(toy):
    prefill, _ = toy_traces(toy)
    by_name = {(r.layer, r.op): r for r in prefill.ops}
    assert op_cost(by_name[(None, "embed")], 8) == (0, 2 * 4 * 8 * 8)
    assert op_cost(by_name[(0, "swiglu")], 8) == (0, 3 * 4 * 16 * 8)
    assert op_cost(by_name[(0, "attn_norm")], 4) == (0, 2 * 4 * 8 * 4)


def test_roofline_arithmetic():
    np.testing.assert_allclose(attainable_gflops([0.25, 1.0, 4.0, 100.0], 20.0, 50.0), [5.0, 20.0, 50.0, 50.0])
    assert ridge_point(20.0, 50.0) == 2.5
    trace = Trace()
    trace.matmul(0, "q_proj", (1, 1000), (1000, 1000))  # 2e6 FLOPs, (1000 + 1e6 + 1000) * 4 bytes
    trace.record(0, "attn_norm", [(1, 1000)], (1, 1000))  # 0 FLOPs, 8000 bytes
    want = 4.008e6 / 20e9 + 8000 / 20e9  # both memory-bound at 20 GB/s, 50 GFLOP/s
    assert predicted_seconds(trace, 4, 20.0, 50.0) == pytest.approx(want, rel=1e-12)
    trace = Trace()
    trace.matmul(0, "q_proj", (1000, 1000), (1000, 1000))  # 2e9 FLOPs, 1.2e7 bytes: compute-bound
    assert predicted_seconds(trace, 4, 20.0, 50.0) == pytest.approx(2e9 / 50e9, rel=1e-12)


def test_speed_functions_report_rates_of_the_median_timed_call(monkeypatch):
    """With the timer replaced by known times, every rate is the work over the median time."""
    from tinydecoder.perf import bench, machine

    model = toy_bench_model()
    assert model.config.max_context == 4096 and model.dtype == np.float32
    ran = []

    def known_times(fn, repeat=5, warmup=1, after=None, before=None):
        for _ in range(3):
            before and before()
            fn()
            ran.append(1)
            after and after()
        return [0.5, 0.1, 0.3]

    monkeypatch.setattr(bench, "run_times", known_times)
    monkeypatch.setattr(machine, "run_times", known_times)
    flops = roofline.traced(model, [bench.bench_tokens(model, 16)], [None]).total_flops()
    p = prefill_speed(model, 16, repeat=3)
    assert p["seconds"] == 0.3 and p["tokens_per_second"] == pytest.approx(16 / 0.3)
    assert p["gflops"] == pytest.approx(flops / 0.3 / 1e9) and flops > 0
    d = decode_speed(model, [8, 4], steps=3, burst=1)
    assert list(d) == [4, 8] and all(v["seconds"] == 0.3 and v["tokens_per_second"] == pytest.approx(1 / 0.3)
                                     for v in d.values())
    d = decode_speed(model, [4], steps=3, burst=3)  # a sample is 3 steps: its time / 3 is a step's
    assert d[4]["seconds"] == pytest.approx(0.1) and d[4]["tokens_per_second"] == pytest.approx(10.0)
    rows = batch_decode_speed(model, (1, 3), context=8, steps=3, bandwidth_gbps=10.0, peak_gflops=50.0)
    assert [r["batch"] for r in rows] == [1, 3]
    assert [r["tokens_per_second"] for r in rows] == [pytest.approx(1 / 0.3), pytest.approx(3 / 0.3)]
    assert rows[1]["predicted_tokens_per_second"] > rows[0]["predicted_tokens_per_second"] > 0
    assert len(ran) >= 3 * (1 + 2 + 2)  # every timed call ran the model


def test_speed_functions_on_the_clock():
    model = toy_bench_model()
    p = prefill_speed(model, 16, repeat=1)
    assert p["tokens_per_second"] * p["seconds"] == pytest.approx(16) and p["seconds"] > 0
    d = decode_speed(model, [8, 4], steps=1)
    assert all(v["tokens_per_second"] * v["seconds"] == pytest.approx(1) for v in d.values())


def test_batch_prediction_from_the_trace():
    """The prediction for B sequences is B / the roofline time of one traced batched step."""
    model = toy_bench_model()
    cache = model.new_cache()
    forward(model, list(range(6)) * 2, cache)
    rows = batch_decode_speed(model, (2,), context=12, steps=1, cache=cache, bandwidth_gbps=10.0, peak_gflops=50.0)
    assert len(cache) == 12  # the caller's cache is not changed
    caches = [cache.copy(), cache.copy()]
    trace = Trace(keep_weights=False)
    forward_each(model, [[1], [2]], caches, last_only=True, trace=trace)
    assert rows[0]["predicted_tokens_per_second"] == pytest.approx(2 / predicted_seconds(trace, 4, 10.0, 50.0))


def test_median_seconds_and_bad_inputs():
    calls = []
    assert median_seconds(lambda: calls.append(1), repeat=3, warmup=2) >= 0
    assert len(calls) == 5
    with pytest.raises(ValueError, match="repeat must be an integer >= 1"):
        median_seconds(lambda: None, repeat=0)
    with pytest.raises(ValueError, match="unknown model 'gpt'"):
        load_bench_model("gpt")


def test_cli_bench_json_for_the_toy(capsys):
    assert cli_main(["bench", "--model", "toy", "--json", "--repeat", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("bandwidth_gbps", "matmul_gflops"):
        assert result[key] > 0
    assert result["fma_gflops"] is None or result["fma_gflops"] > 0  # None without numba
    roof = result["fma_gflops"] or result["matmul_gflops"]  # the compute roof of the ridge and the batch predictions
    assert result["ridge_flops_per_byte"] == pytest.approx(roof / result["bandwidth_gbps"])
    assert set(result["prefill_tokens_per_second"]) == {"128", "512"}
    for key in ("decode_tokens_per_second", "decode_roof_fraction"):
        assert set(result[key]) == {"128", "512", "2048"} and all(v > 0 for v in result[key].values())
    assert set(result["pass_cost"]) == {"128", "512"}
    assert all(set(c) == {"2", "3", "4", "8"} and all(v > 0 for v in c.values()) for c in result["pass_cost"].values())
    assert result["speculative_speedup"] is None  # the toy has no text to copy
    targets = result["targets"]
    assert "pass over 4 rows at context 128, in decode steps" in targets
    t = targets["decode at context 2048, share of the bandwidth roof"]
    assert t["target"] == ">= 0.7" and t["met"] == (t["measured"] >= 0.7)
    assert [row["batch"] for row in result["batch_decode"]] == [1, 2, 4, 8, 16, 32]
    for row in result["batch_decode"]:
        assert row["tokens_per_second"] > 0 and row["predicted_tokens_per_second"] > 0
    assert result["batch_decode"][0]["speedup_vs_batch_1"] == 1.0
    assert result["weights_bytes"] == toy_bench_model().nbytes
    from tinydecoder.perf.machine import cpu_description

    assert result["cpu"] == cpu_description() and "\n" not in result["cpu"]  # this machine's, in one line
    from tinydecoder.perf.bench import format_report

    text = format_report(result | {"weights": None})
    if result["fma_gflops"]:  # the cores' roof beside numpy's, and what share of it numpy reaches
        share = f"{result['matmul_gflops'] / result['fma_gflops']:.0%}"
        assert "FMA peak" in text and f"numpy's matmul reaches {share} of it" in text
        assert f"{result['prefill_gflops']['128'] / result['fma_gflops']:.0%} of the FMA peak" in text


def test_describe_cpu_from_cpuinfo():
    """The first processor's model, family and widest vector extension; the platform's names without
    /proc/cpuinfo."""
    from tinydecoder.perf.machine import describe_cpu

    info = ("processor\t: 0\nmodel name\t: AMD EPYC 9R14\ncpu family\t: 25\nmodel\t\t: 17\n"
            "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512vl\n\n"
            "processor\t: 1\nmodel name\t: something else\nflags\t\t: sse2\n")
    assert describe_cpu(info, 2) == "AMD EPYC 9R14 (family 25 model 17), 2 cores, AVX-512"
    assert describe_cpu(info.replace(" avx512f", ""), 1) == "AMD EPYC 9R14 (family 25 model 17), 1 core, AVX2"
    assert describe_cpu("", 8, "arm64", "") == "arm64, 8 cores"
    assert describe_cpu("", 4, "x86_64", "Intel64 Family 6") == "Intel64 Family 6, 4 cores"
    assert describe_cpu("", 4) == "unknown CPU, 4 cores"


def test_cli_bench_table_and_bad_model(capsys):
    with pytest.raises(SystemExit):
        cli_main(["bench", "--model", "gpt"])
    assert "invalid choice" in capsys.readouterr().err


def test_run_bench_small():
    result = run_bench(toy_bench_model(), lengths=(8, 16), decode_contexts=(8, 16), batch_sizes=(1, 2),
                       batch_context=8, repeat=1, bandwidth_bytes=2**20, matmul_n=64)
    assert set(result["decode_tokens_per_second"]) == {"8", "16"}
    kv_per_position = toy_bench_model().config.kv_bytes_per_token(4)  # K and V, every layer, float32
    for c in (8, 16):
        step_bytes = result["weights_bytes"] + (c + 1) * kv_per_position  # weights + the cache it reads
        assert result["decode_bytes_per_token"][str(c)] == step_bytes
        assert 0 < result["decode_bandwidth_gbps"][str(c)] < 1e4 and 0 < result["decode_roof_fraction"][str(c)]
        low, high = result["decode_bandwidth_range_gbps"][str(c)]
        assert low <= result["decode_bandwidth_gbps"][str(c)] <= high
    for n in ("8", "16"):  # prefill paired with matmul probes the same way
        assert result["prefill_matmul_gflops"][n] > 0 and result["prefill_matmul_fraction"][n] > 0


def test_decode_roof_fraction_pairs_each_step_with_a_probe(toy, monkeypatch):
    """Each timed step is paired with the probe run just before it: the fraction is the median of
    step_bytes / step_time / probe_bandwidth over the pairs (fake clock and probe: exact values)."""
    import tinydecoder.perf.bench as bench

    step_times = iter([0.5, 0.25, 0.5, 0.125])  # warm-up, then 3 timed steps
    probes = iter([99.0, 4.0, 2.0, 8.0])  # GB/s, the first before the warm-up
    monkeypatch.setattr(bench, "run_times", _fake_run_times(step_times))
    out = bench.decode_speed(toy, [4], steps=3, probe=lambda: next(probes), burst=1)[4]
    step_bytes = bench.decode_step_bytes(toy, 4)
    pairs = [step_bytes / t / (g * 1e9) for t, g in ((0.25, 4.0), (0.5, 2.0), (0.125, 8.0))]
    assert out["roof_fraction"] == pytest.approx(float(np.median(pairs)))
    assert out["bandwidth_gbps"] == 4.0 and out["seconds"] == 0.25
    assert out["bandwidth_range_gbps"] == [2.0, 8.0]  # the paired probes only, not the warm-up's 99
    assert step_bytes == toy.nbytes + 5 * toy.config.kv_bytes_per_token(toy.dtype.itemsize)


def test_prefill_matmul_fraction_pairs_each_prefill_with_a_probe(toy, monkeypatch):
    """Like decode: each timed prefill follows one matmul probe; the fraction is the median of
    (traced FLOPs / prefill time) / probe FLOP/s over the pairs (fake clock and probe)."""
    import tinydecoder.perf.bench as bench

    monkeypatch.setattr(bench, "run_times", _fake_run_times(iter([0.5, 0.25, 1.0])))  # warmup=0: 3 timed
    probes = iter([2.0, 1.0, 4.0])  # GFLOP/s
    out = bench.prefill_speed(toy, 6, repeat=3, probe=lambda: next(probes))
    flops = roofline.traced(toy, [bench.bench_tokens(toy, 6)], [None]).total_flops()
    pairs = [flops / t / (g * 1e9) for t, g in ((0.5, 2.0), (0.25, 1.0), (1.0, 4.0))]
    assert out["matmul_fraction"] == pytest.approx(float(np.median(pairs)))
    assert out["matmul_gflops"] == 2.0 and out["seconds"] == 0.5 and out["gflops"] == pytest.approx(flops / 0.5 / 1e9)


def test_matmul_probe_counts_flops():
    from tinydecoder.perf.machine import matmul_probe

    probe = matmul_probe(64)
    assert probe.n == 64 and 0 < probe() < 1e6


@pytest.mark.parametrize("kernel", ["fast", "numpy"])
def test_bandwidth_probe_reads_a_matrix_shaped_like_the_models(kernel):
    """The probe's W has PROBE_INPUTS rows (SmolLM2's width), as many columns as the bytes allow, is
    stored as each kernel reads a decode step's weights, and the probe gives a rate."""
    from tinydecoder.perf.machine import PROBE_INPUTS, bandwidth_probe

    probe = bandwidth_probe(2**20, kernel)
    w = probe.matrix
    assert w.shape == (PROBE_INPUTS, 2**20 // (4 * PROBE_INPUTS)) and probe.nbytes == w.nbytes <= 2**20
    assert w.flags.f_contiguous if kernel == "fast" else w.flags.c_contiguous
    assert 0 < probe() < 1e6
    with pytest.raises(ValueError, match="kernel must be 'fast' or 'numpy'"):
        bandwidth_probe(2**20, "blas")


def _fake_run_times(step_times):
    """run_times with a fake clock: calls before/fn/after like the real one, returns given times."""
    def run_times(fn, repeat=5, warmup=1, after=None, before=None):
        times = []
        for i in range(warmup + repeat):
            before and before()
            fn()
            after and after()
            t = next(step_times)
            if i >= warmup:
                times.append(t)
        return times
    return run_times


def test_roofline_view_and_widget(toy):
    import matplotlib.pyplot as plt

    from tinydecoder.perf.roofline import decode_intensities_by_batch, roofline_view
    from tinydecoder.widgets import roofline_figure, roofline_widget

    cache = toy.new_cache()
    forward(toy, SEED_PROMPT, cache)
    by_batch = decode_intensities_by_batch(toy, cache, (1, 4))
    assert len(cache) == 4
    assert by_batch[1]["q_proj"]["intensity"] == 0.2 and by_batch[4]["q_proj"]["intensity"] == 0.5
    view = roofline_view(by_batch[1], bandwidth_gbps=10.0, peak_gflops=40.0)  # ridge at 4 FLOP/byte
    assert view["ridge"] == 4.0 and set(view["bound"]) == {"memory"}
    np.testing.assert_allclose(view["attainable"], 10.0 * view["intensity"])
    view = roofline_view({"big": {"intensity": 10.0}}, 10.0, 40.0)
    assert view["bound"] == ["compute"] and view["attainable"].tolist() == [40.0]

    box = roofline_widget(by_batch, 10.0, 40.0, prefill=by_batch[4])
    assert box.data["batch"] == 1
    box.controls["batch"].value = 4
    assert box.data["batch"] == 4 and box.data["intensity"][0] == 0.5
    fig = roofline_figure(10.0, 40.0, {"ops": ([0.5], [5.0], ["q_proj"])})
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and "intensity" in ax.get_xlabel()
    plt.close("all")


def test_cache_copy_has_room_and_leaves_the_original(toy):
    from tinydecoder.perf.bench import cache_copy

    cache = toy.new_cache()
    forward(toy, SEED_PROMPT, cache)
    copy = cache_copy(cache, extra=3)
    assert copy.capacity == 7 and len(copy) == 4
    np.testing.assert_array_equal(copy.k[1][:4], cache.k[1][:4])
    forward(toy, [1, 2, 3], copy)
    assert copy.capacity == 7 and len(copy) == 7 and len(cache) == 4
    np.testing.assert_array_equal(forward(toy, [0], cache_copy(cache)), forward(toy, [0], cache.copy()))


def test_run_times_best_and_median():
    from tinydecoder.perf.machine import best_seconds, run_times

    calls = []
    times = run_times(lambda: calls.append(1), repeat=4, warmup=1, after=lambda: calls.append(0))
    assert len(times) == 4 and calls == [1, 0] * 5 and all(t >= 0 for t in times)
    assert best_seconds(lambda: None, repeat=3) >= 0


def test_both_paths_are_timed_and_agree_on_shapes():
    model = load_bench_model("toy")
    for path in ("fast", "reference"):
        rows = batch_decode_speed(model, (1, 2), context=6, steps=1, path=path)
        assert [r["batch"] for r in rows] == [1, 2] and all(r["tokens_per_second"] > 0 for r in rows)
        assert set(decode_speed(model, [4], steps=1, path=path)) == {4}
    with pytest.raises(ValueError, match="path must be one of"):
        prefill_speed(model, 4, repeat=1, path="slow")


def test_gemm_times_rows_and_errors():
    """One row per M; plain and project compute the same product (checked in tests of fast), so
    here: the fields, positive times, and weights_gbps = W's bytes / seconds."""
    from tinydecoder.perf.machine import gemm_times

    rows = gemm_times(32, 48, rows=(1, 2, 3), repeat=1)
    assert [r["rows"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["plain_seconds"] > 0 and r["project_seconds"] > 0
        assert np.isclose(r["plain_weights_gbps"], 32 * 48 * 4 / r["plain_seconds"] / 1e9)
    with pytest.raises(ValueError, match="rows must be integers >= 1"):
        gemm_times(8, 8, rows=(0,))


def test_overhead_twin_keeps_layers_and_groups():
    import dataclasses

    from tinydecoder.core.toy import random_model, toy_config
    from tinydecoder.perf.bench import overhead_twin

    cfg = dataclasses.replace(toy_config(), n_layers=5, n_heads=6, n_kv_heads=2, position="rope", head_dim=4)
    model = random_model(cfg, seed=1)
    twin = overhead_twin(model, width=4)
    t = twin.config
    assert (t.n_layers, t.n_heads, t.n_kv_heads, t.position, t.vocab_size) == (5, 3, 1, "rope", 64)
    assert twin.nbytes < model.nbytes or model.nbytes < 10_000
    logits = forward(twin, [1, 2, 3])
    assert logits.shape == (3, 64) and logits.dtype == np.float32


def test_batch_decode_per_sequence_attention_on_toy():
    """stacked=False keeps the caches separate (attention once per sequence); same fields."""
    model = toy_bench_model()
    rows = batch_decode_speed(model, (1, 2), context=8, steps=1, stacked=False)
    assert [r["batch"] for r in rows] == [1, 2] and all(r["tokens_per_second"] > 0 for r in rows)


def test_h100_ridge_from_published_figures():
    from tinydecoder.perf.machine import H100_SXM

    assert round(ridge_point(H100_SXM["bandwidth_gbps"], H100_SXM["peak_gflops"])) == 295


def test_pass_cost_is_each_rounds_ratio_to_a_one_row_step(toy, monkeypatch):
    """pass_cost: the median over rounds of (n-row pass) / (the same round's 1-row step), the
    cache rolled back after every pass; the targets beside each measurement."""
    from tinydecoder.perf import bench_rows

    clock = iter(np.arange(0.0, 1e6, 1.0))
    widths = []
    real = bench_rows.fast.forward

    def fake_forward(model, ids, cache, last_only):
        widths.append((len(ids), len(cache)))
        real(model, ids, cache, last_only=last_only)
        for _ in range(len(ids) - 1):  # an n-row pass "takes" n ticks of the fake clock
            next(clock)

    monkeypatch.setattr(bench_rows.time, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(bench_rows.fast, "forward", fake_forward)
    cost = bench_rows.pass_cost(toy, rows=(2, 4), contexts=(5, 3), repeat=2)
    assert cost == {"3": {"2": 2.0, "4": 4.0}, "5": {"2": 2.0, "4": 4.0}}
    assert all(past in (3, 5) for n, past in widths if n <= 4)  # every timed pass saw exactly its context
    report = bench_rows.targets_report({"pass_cost": {"128": {"4": 1.4, "8": 2.1}},
                                        "batch_decode": [{"batch": 16, "speedup_vs_batch_1": 6.5}],
                                        "decode_roof_fraction": {"2048": 0.65}})
    assert report["pass over 4 rows at context 128, in decode steps"]["met"] is True
    assert report["pass over 8 rows at context 128, in decode steps"]["met"] is False
    assert report["batch 16 tokens/s over batch 1"]["met"] is True
    assert report["decode at context 2048, share of the bandwidth roof"]["met"] is False


def test_decode_trace_of_a_cut_model_predicts_what_the_whole_trace_does():
    """roofline.decode_trace traces a decode step on the first 2 blocks only; its layer 0, counted
    once per layer, gives the whole model's roofline time and layer-0 intensities."""
    from tinydecoder import Config
    from tinydecoder.core.toy import random_model
    from tinydecoder.perf import bench

    cfg = Config(vocab_size=50, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, n_layers=5, d_ff=24,
                    max_context=64, position="rope", norm_eps=1e-5, name="five-layers")
    model = random_model(cfg, seed=1, dtype=np.float32)
    cache = bench.prefilled_cache(model, 9)
    batch = [[3], [7], [11]]
    whole = roofline.traced(model, batch, [cache] * 3)
    cut, layers = roofline.decode_trace(model, batch, cache)
    assert layers == 5 and {r.layer for r in cut.ops} == {None, 0, 1} and len(cache) == 9
    for bw, peak in ((20.0, 100.0), (1.0, 1e6)):
        assert roofline.predicted_seconds(cut, 4, bw, peak, layers=layers) == \
            pytest.approx(roofline.predicted_seconds(whole, 4, bw, peak), rel=1e-12)
    assert roofline.decode_intensities_by_batch(model, cache, (1, 3)) == \
        {b: roofline.layer_intensities(roofline.traced(model, batch[:b], [cache] * b), 4, 0) for b in (1, 3)}


def test_batch_sizes_take_turns_one_step_each_per_round(monkeypatch):
    """batch_decode_speed times round by round, every batch size once per round (round 0 untimed),
    so that a drifting machine moves every batch size alike; each cache is rolled back after its
    step, and the caller's cache is not changed."""
    from tinydecoder.perf import bench

    model = toy_bench_model()
    calls, real = [], bench.PATHS["fast"]
    monkeypatch.setitem(bench.PATHS, "fast", (real[0], lambda m, batch, caches, **kw:
                                              calls.append((len(batch), len(caches))) or real[1](m, batch, caches, **kw)))
    cache = model.new_cache()
    forward(model, bench.bench_tokens(model, 8), cache)
    rows = batch_decode_speed(model, (1, 2, 4), context=8, steps=2, cache=cache)
    assert [b for b, _ in calls] == [1, 2, 4] * 3  # a warm-up round, then 2 timed rounds
    assert all(n == 8 for _, n in calls)  # every step ran after exactly 8 positions: rolled back each time
    assert len(cache) == 8 and [r["batch"] for r in rows] == [1, 2, 4]


def test_decode_speed_times_bursts_of_steps_after_each_probe(toy, monkeypatch):
    """A sample is `burst` steps back to back after one probe, each step from the same context
    (the cache is cut back after every step), and a step's time is the sample's over `burst`."""
    import tinydecoder.perf.bench as bench

    seen, probes = [], []
    forward, forward_batch = bench.forward_of("fast")

    def counting(model, ids, cache, last_only=False):
        seen.append((len(probes), len(cache)))
        return forward(model, ids, cache, last_only=last_only)

    monkeypatch.setitem(bench.PATHS, "fast", (counting, forward_batch))
    monkeypatch.setattr(bench, "run_times", _fake_run_times(iter([9.0, 0.9, 0.6])))  # warm-up, 2 timed
    out = bench.decode_speed(toy, [4], steps=2, probe=lambda: probes.append(1) or 5.0, burst=3)[4]
    assert seen == [(p, 4) for p in (1, 2, 3) for _ in range(3)]  # 3 steps after each of 3 probes, at context 4
    assert out["seconds"] == pytest.approx(0.25) and out["tokens_per_second"] == pytest.approx(4.0)
    for bad in (0, 1.5, "2"):
        with pytest.raises(ValueError, match="burst"):
            bench.decode_speed(toy, [4], steps=1, burst=bad)
