"""Part III course helpers: static batching, the blocks admission sees, sliding-window KV
bytes, published sources of the known configs, categorical block colours."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tinydecoder as td  # noqa: E402
from tinydecoder import viz  # noqa: E402
from tinydecoder.serving.backends import ContiguousKV, PagedKV  # noqa: E402
from tinydecoder.serving.capacity import CONFIG_SOURCES, KNOWN_CONFIGS, kv_spec, sliding_window_kv_bytes  # noqa: E402
from tinydecoder.serving.scheduler import (  # noqa: E402
    DECODING,
    DONE,
    PREFILLING,
    Request,
    demo_requests,
    run_one_at_a_time,
    run_schedule,
    timeline_codes,
)
from tinydecoder.serving.static_batching import run_static_batches, static_batches  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return td.toy_model()


# ----------------------------------------------------------------------------- static batching
@pytest.mark.parametrize("batch_size", [1, 2, 3, 5, 8])
def test_static_batches_give_each_request_what_generate_gives(model, batch_size):
    requests = demo_requests("staggered")
    sched = run_static_batches(model, requests, batch_size)
    for r in sched.results:
        alone = td.generate(model, list(r.request.prompt), r.request.max_new_tokens)
        assert r.tokens == alone.new_tokens
        assert max(float(np.abs(a - e.logits).max()) for a, e in zip(r.logits, alone.events)) < 1e-9


def test_static_batch_timing_rules(model):
    requests = demo_requests("staggered")  # arrivals 0, 1, 2, 4, 5; new tokens 6, 8, 4, 6, 5
    sched = run_static_batches(model, requests, 2)
    assert static_batches(requests, 2) == [[0, 1], [2, 3], [4]]
    res = sched.results
    # batch [A, B] starts when B (the last member) has arrived: step 1; all prefill there
    assert res[0].admitted == res[1].admitted == 1 and res[0].first_token_step == res[1].first_token_step == 1
    # it lasts until its longest member (B, 8 tokens) finishes: steps 1..8; A finishes early
    assert res[1].finish_step == 8 and res[0].finish_step == 6
    # the next batch [C, D] starts only after the previous one ended, even though both arrived earlier
    assert res[2].admitted == res[3].admitted == 9
    assert res[3].finish_step == 9 + 6 - 1 and res[4].admitted == res[3].finish_step + 1
    assert sched.total_steps == res[4].finish_step + 1 == 20
    # the first step of a batch prefills every whole prompt, later steps decode every unfinished member
    first = sched.steps[1]
    assert [(w.request, w.phase, w.n_tokens) for w in first.entries] == [(0, "prefill", 10), (1, "prefill", 4)]
    assert [w.request for w in sched.steps[7].entries] == [1]  # A done at 6: B decodes alone
    assert sched.steps[0].idle and sched.steps[0].waiting == 1  # A waits for B
    codes = timeline_codes(sched)
    assert codes[0, 7] == DONE and codes[1, 7] == DECODING and codes[2, 9] == PREFILLING
    assert all(r.tpot == 1.0 for r in res)


def test_static_batch_of_one_is_one_at_a_time_and_all_at_once_needs_the_longest(model):
    requests = demo_requests("staggered")
    one, base = run_static_batches(model, requests, 1), run_one_at_a_time(model, requests)
    assert [(r.admitted, r.first_token_step, r.finish_step) for r in one.results] == \
           [(r.admitted, r.first_token_step, r.finish_step) for r in base.results]
    burst = demo_requests("all at once")
    whole = run_static_batches(model, burst, 5)
    assert whole.total_steps == max(r.max_new_tokens for r in burst) and whole.forward_calls == whole.total_steps


def test_static_batching_is_slower_than_continuous_with_the_same_slots(model):
    requests = demo_requests("staggered")
    for size in (2, 3):
        static = run_static_batches(model, requests, size).summary()
        cont = run_schedule(model, requests, token_budget=None, max_running=size).summary()
        assert cont["total_steps"] < static["total_steps"] and cont["mean_ttft"] < static["mean_ttft"]


def test_static_batching_errors(model):
    with pytest.raises(ValueError, match="batch_size"):
        run_static_batches(model, demo_requests(), 0)
    with pytest.raises(ValueError, match="no requests"):
        run_static_batches(model, [], 2)
    with pytest.raises(ValueError, match="context limit"):
        run_static_batches(model, [Request([1] * 60, 10)], 2)


# ----------------------------------------------------------------------------- admission blocks
def test_available_blocks_are_free_minus_promised(model):
    backend = PagedKV(model, n_blocks=12, block_size=4)
    sched = run_schedule(model, demo_requests("staggered"), token_budget=8, backend=backend)
    avail = [s.available_blocks for s in sched.steps]
    assert all(a is not None and 0 <= a <= s.free_blocks for a, s in zip(avail, sched.steps))
    assert any(a < s.free_blocks for a, s in zip(avail, sched.steps))  # promises are not free to admit
    assert avail[-1] == sched.steps[-1].free_blocks == 12 and backend.promised_blocks == 0
    # by hand: admit one request of 10 + 6 - 1 = 15 positions (4 blocks), prefill 8 positions (2 blocks)
    fresh = PagedKV(model, n_blocks=12, block_size=4)
    seq, cached = fresh.admit(Request([0, 1, 2, 3, 4, 5, 0, 1, 2, 3], 6))
    td.forward(model, [0, 1, 2, 3, 4, 5, 0, 1], seq)
    assert (fresh.free_blocks, fresh.promised_blocks, fresh.available_blocks) == (10, 2, 8)
    fresh.release(seq)
    assert (fresh.free_blocks, fresh.promised_blocks, fresh.available_blocks) == (12, 0, 12)


def test_contiguous_backend_promises_nothing(model):
    backend = ContiguousKV(model, capacity_tokens=40)
    sched = run_schedule(model, demo_requests("staggered"), token_budget=8, backend=backend)
    assert all(s.available_blocks == s.free_blocks for s in sched.steps)


# ----------------------------------------------------------------------------- capacity
def test_sliding_window_kv_bytes_caps_at_the_window():
    mistral = KNOWN_CONFIGS["Mistral-7B"]
    per_token = kv_spec(mistral, "float16").bytes_per_token
    assert per_token == 131_072
    assert sliding_window_kv_bytes(mistral, 1000, 4096, "float16") == 1000 * per_token
    assert sliding_window_kv_bytes(mistral, 32768, 4096, "float16") == 4096 * per_token == 512 * 2 ** 20
    assert sliding_window_kv_bytes(mistral, 5000, 4096, "float16", block_size=16) == 4096 * per_token
    assert sliding_window_kv_bytes(mistral, 10, 4096, "float16", block_size=16) == 16 * per_token
    with pytest.raises(ValueError, match="window"):
        sliding_window_kv_bytes(mistral, 100, 0, "float16")
    with pytest.raises(ValueError, match="context"):
        sliding_window_kv_bytes(mistral, -1, 4096, "float16")


def test_sliding_window_kv_bytes_of_a_tinydecoder_config():
    smollm2 = td.Config(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30,
                        d_ff=1536, max_context=8192, position="rope")
    assert smollm2.kv_bytes_per_token(4) == 46080
    assert sliding_window_kv_bytes(smollm2, 8192, 4096) == 4096 * 46080  # float32 by default
    assert sliding_window_kv_bytes(smollm2, 100, 4096) == 100 * 46080
    assert [sliding_window_kv_bytes(smollm2, t, 4) for t in (1, 3, 9)] == [46080, 3 * 46080, 4 * 46080]


def test_every_known_config_has_a_published_source():
    assert set(CONFIG_SOURCES) == set(KNOWN_CONFIGS)
    assert "Touvron" in CONFIG_SOURCES["Llama-2-7B"] and "Jiang" in CONFIG_SOURCES["Mistral-7B"]
    assert all("config.json" in src for src in CONFIG_SOURCES.values())


# ----------------------------------------------------------------------------- figures
def test_block_ids_get_categorical_colours():
    cmap = viz.block_id_colors(25)
    colours = [cmap(i) for i in range(25)]
    assert cmap.N == 25 and len(set(colours[:20])) == 20 and colours[20] == colours[0]
    fig, ax = plt.subplots()
    im = viz.block_table_heatmap(ax, [[0, 1, 2], [3, -1, -1]], n_blocks=4)
    assert [im.cmap(im.norm(i)) for i in range(4)] == [cmap(i) for i in range(4)]
    plt.close(fig)
    with pytest.raises(ValueError, match="n_blocks"):
        viz.block_id_colors(0)


def test_block_holders_colour_bar_runs_to_the_number_of_sequences():
    table = np.array([[0, 1, 2], [0, 1, 3], [0, 4, -1], [0, 5, -1]])
    holders = np.array([[4, 2, 1], [4, 2, 1], [4, 1, 0], [4, 1, 0]])
    fig, ax = plt.subplots()
    im = viz.block_holders_heatmap(ax, table, holders, n_sequences=4)
    assert list(im.colorbar.get_ticks()) == [1, 2, 3, 4]
    assert im.norm.vmin == 0.5 and im.norm.vmax == 4.5
    assert sorted(t.get_text() for t in ax.texts) == sorted(str(b) for b in table.ravel() if b >= 0)
    plt.close(fig)
    with pytest.raises(ValueError, match="one shape"):
        viz.block_holders_heatmap(ax, table, holders[:2])
