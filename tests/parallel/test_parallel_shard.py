"""Sharding arithmetic, without MPI: which degrees are allowed, what a rank holds, what a token costs."""
import numpy as np
import pytest

from tinydecoder.core.config import Config
from tinydecoder.core.toy import random_model
from tinydecoder.parallel.comm import ring_bytes
from tinydecoder.parallel.disagg import kv_bytes
from tinydecoder.parallel.shard import allowed_degrees, check_degree, local_config, shard_model
from tinydecoder.parallel.tp import expected_traffic, small_tp_config, step_time_model

SMOLLM2 = Config(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30, d_ff=1536,
                 max_context=8192, position="rope", tied_embeddings=True, name="SmolLM2-135M")


def test_smollm2_allows_only_1_and_3():
    assert allowed_degrees(SMOLLM2) == [1, 3]
    with pytest.raises(ValueError, match=r"degree 2 does not divide 9 query heads, 3 KV heads.*Allowed degrees: \[1, 3\]"):
        check_degree(SMOLLM2, 2)
    with pytest.raises(ValueError, match="degree 9 does not divide 3 KV heads, 1536 FFN units"):
        check_degree(SMOLLM2, 9)
    with pytest.raises(ValueError, match=">= 1"):
        check_degree(SMOLLM2, 0)
    with pytest.raises(TypeError, match="integer"):
        check_degree(SMOLLM2, "3")
    assert check_degree(SMOLLM2, 3) == 3


def test_local_config_has_a_third_of_everything():
    local = local_config(SMOLLM2, 3)
    assert (local.n_heads, local.n_kv_heads, local.d_ff, local.vocab_size) == (3, 1, 512, 16384)
    assert local.kv_bytes_per_token() * 3 == SMOLLM2.kv_bytes_per_token() == 46080  # 2*30*3*64*4


def test_shards_are_views_that_tile_the_weights():
    model = random_model(small_tp_config(), seed=1)
    shards = [shard_model(model, r, 3) for r in range(3)]
    layer = model.layers[0]
    for s in shards:  # views: nothing copied
        assert np.shares_memory(s.layers[0].wq, layer.w_qkv) and np.shares_memory(s.embed, model.embed)
        assert np.shares_memory(s.layers[0].w_down, layer.w_down)
    np.testing.assert_array_equal(np.concatenate([s.layers[0].wq for s in shards], axis=1), layer.wq)
    np.testing.assert_array_equal(np.concatenate([s.layers[0].wk for s in shards], axis=1), layer.wk)
    np.testing.assert_array_equal(np.concatenate([s.layers[0].w_up for s in shards], axis=1), layer.w_up)
    np.testing.assert_array_equal(np.concatenate([s.layers[0].wo for s in shards], axis=0), layer.wo)
    np.testing.assert_array_equal(np.concatenate([s.embed for s in shards], axis=0), model.embed)
    assert [s.vocab for s in shards] == [(0, 16), (16, 32), (32, 48)]
    replicated = sum(a.nbytes for a in (model.final_norm,)) + sum(w.attn_norm.nbytes + w.ffn_norm.nbytes for w in model.layers)
    assert sum(s.nbytes for s in shards) == model.nbytes + 2 * replicated


def test_the_math_of_row_and_column_parallel_layers():
    """Without MPI: the sum over ranks of (x W_col,r) W_row,r equals x W_col W_row."""
    model = random_model(small_tp_config(), seed=2, dtype=np.float64)
    x = np.random.default_rng(0).standard_normal((4, 32))
    layer = model.layers[0]
    hidden = (x @ layer.w_gate) * (x @ layer.w_up)
    whole = hidden @ layer.w_down
    parts = [((x @ s.layers[0].w_gate) * (x @ s.layers[0].w_up)) @ s.layers[0].w_down
             for s in (shard_model(model, r, 3) for r in range(3))]
    np.testing.assert_allclose(sum(parts), whole, rtol=1e-12, atol=1e-12)


def test_traffic_per_token_for_smollm2():
    t = expected_traffic(SMOLLM2, 3)
    assert t["allreduce"] == 61  # 2 per layer + the embedding's
    assert t["allreduce_bytes"] == 61 * 576 * 4 == 140544
    assert t["gather_bytes"] == 16384 * 4
    assert t["ring_bytes_sent"] == pytest.approx(140544 * 4 / 3)
    assert ring_bytes(300, 3) == 400
    assert expected_traffic(SMOLLM2, 3, rows=5)["allreduce_bytes"] == 5 * 140544


def test_step_time_model_and_kv_bytes():
    assert step_time_model(3.0e9, 1.5e9, 1e-3, 30) == pytest.approx(2.0 + 0.06)
    assert kv_bytes(random_model(small_tp_config()), 10) == 10 * 2 * 2 * 3 * 8 * 4


def test_views_draw_and_the_widget_recomputes():
    from tinydecoder.parallel import views

    rows = views.model_rows(3e9, 10, 1e9, 1e-3, degrees=(1, 3))
    assert rows[1] == (3.0, 0.0) and rows[3] == pytest.approx((1.0, 0.02))  # tp=1 waits for no all-reduce
    assert views.timing_figure({"tp=1": {"step_seconds": 0.2, "comm_seconds": 0.0},
                                "tp=3": {"step_seconds": 0.3, "comm_seconds": 0.2}}).axes
    box = views.step_model_widget()
    first = box.data[3]
    box.controls["latency"].value = 40.0
    assert box.data[3][1] > first[1] and box.data[3][0] == first[0]  # only the all-reduce term moves
    assert set(box.data) == {1, 3}  # SmolLM2's shapes allow 1 and 3
    box.controls["model"].value = "Llama-3-70B, bfloat16"
    assert set(box.data) == {1, 2, 4, 8}
    w = views.tpot_widget([0.1, 0.1, 0.1, 2.0], [0.1, 0.12, 0.11, 0.13])
    assert w.data["colocated"] > w.data["disaggregated"]
    assert views.tpot_figure([0.1, 2.0], [0.1, 0.2]).axes


def test_the_launcher_reads_which_rank_open_mpi_saw_die():
    from tinydecoder.parallel.launch import died

    assert died("Process name: [prterun-host-15421@1,1]\n  Exit code:    3") == (1, 3)  # Open MPI 5
    assert died("Process name: [[1234,1],2]\n  Exit code: 7") == (2, 7)  # Open MPI 4
    assert died("mpiexec: something else") == (None, None)
