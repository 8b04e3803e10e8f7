"""The KV capacity calculator: published figures, the KV-head count, block rounding, errors."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinydecoder import toy_config
from tinydecoder.core.config import Config
from tinydecoder.serving.capacity import (
    GIB,
    KIB,
    KNOWN_CONFIGS,
    KVSpec,
    bytes_per_element,
    bytes_per_request,
    bytes_per_token,
    capacity_for,
    capacity_table,
    format_bytes,
    kv_spec,
    requests_that_fit,
)


def test_llama2_7b_is_512_kib_per_token():
    assert bytes_per_token(KNOWN_CONFIGS["Llama-2-7B"], "float16") == 512 * KIB == 524_288


def test_llama2_13b_at_8192_tokens_is_about_6_7_gb():
    per_seq = bytes_per_request(KNOWN_CONFIGS["Llama-2-13B"], 8192, "bf16")
    assert per_seq == 2 * 40 * 40 * 128 * 2 * 8192 == 6_710_886_400
    assert round(per_seq / 1e9, 1) == 6.7


def test_smollm2_is_46080_bytes_per_token_in_float32():
    assert bytes_per_token(KNOWN_CONFIGS["SmolLM2-135M"], "float32") == 46_080
    spec = kv_spec(KNOWN_CONFIGS["SmolLM2-135M"], np.float32)
    assert (spec.n_layers, spec.n_kv_heads, spec.head_dim) == (30, 3, 64)


def test_config_and_hf_dict_agree_and_match_config_method():
    cfg = Config(vocab_size=10, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, n_layers=30,
                 d_ff=16, max_context=32)
    assert kv_spec(cfg).bytes_per_token == cfg.kv_bytes_per_token(4) == bytes_per_token(KNOWN_CONFIGS["SmolLM2-135M"], 4)
    assert kv_spec(cfg, "float16").bytes_per_token == cfg.kv_bytes_per_token(2)
    assert bytes_per_token(toy_config(), np.float64) == 2 * 2 * 1 * 4 * 8 == 128


def test_gqa_uses_kv_heads_not_query_heads():
    spec = kv_spec(KNOWN_CONFIGS["Llama-2-70B"], "float16")
    assert spec.bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert spec.naive_bytes_per_token == 2 * 80 * 64 * 128 * 2
    assert spec.naive_bytes_per_token == 8 * spec.bytes_per_token  # Hq / Hkv = 8
    mha = kv_spec(KNOWN_CONFIGS["Llama-2-7B"], "float16")
    assert mha.naive_bytes_per_token == mha.bytes_per_token  # equal only for MHA


def test_missing_kv_heads_means_mha_and_head_dim_field_wins():
    base = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    assert kv_spec(base, "fp32").n_kv_heads == 4
    assert kv_spec({**base, "head_dim": 32}, "fp32").head_dim == 32
    assert kv_spec(base, "fp32").head_dim == 16
    assert kv_spec({**base, "torch_dtype": "bfloat16"}).bytes_per_element == 2


def test_block_rounding():
    spec = KVSpec(n_layers=1, n_kv_heads=1, head_dim=1, bytes_per_element=1)  # 2 bytes per token
    assert spec.bytes_per_request(17) == 34
    assert spec.bytes_per_request(17, block_size=16) == 64
    assert spec.bytes_per_request(32, block_size=16) == 64
    assert spec.requests_that_fit(100, 17) == 2  # 100 // 34
    assert spec.requests_that_fit(100, 17, block_size=16) == 1  # 100 // 64
    assert spec.requests_that_fit(0, 5) == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 96), st.integers(1, 16), st.sampled_from([32, 64, 128]), st.sampled_from(["fp32", "fp16", "fp8"]),
       st.integers(1, 40_000), st.integers(1, 64), st.integers(0, 2 ** 36))
def test_fit_properties(layers, kv, d, dtype, context, block, budget):
    spec = KVSpec(layers, kv, d, bytes_per_element(dtype))
    per, per_blocked = spec.bytes_per_request(context), spec.bytes_per_request(context, block)
    assert per == spec.bytes_per_token * context
    assert per <= per_blocked < per + block * spec.bytes_per_token  # at most one partial block more
    n = spec.requests_that_fit(budget, context, block)
    assert n * per_blocked <= budget < (n + 1) * per_blocked
    # the paged view: whole blocks in the budget, then whole requests in the blocks
    blocks = budget // (block * spec.bytes_per_token)
    assert n == blocks // math.ceil(context / block)
    assert spec.requests_that_fit(budget, context) >= n


def test_table_and_widget_logic():
    specs = [kv_spec(KNOWN_CONFIGS[m], "fp16", name=m) for m in ("Llama-2-7B", "Llama-2-13B")]
    rows = capacity_table(specs, 4096, 80 * GIB)
    assert [r["model"] for r in rows] == ["Llama-2-7B", "Llama-2-13B"]
    assert rows[0]["bytes_per_request"] == 2 * GIB and rows[0]["requests"] == 40
    assert rows[1]["requests"] == 80 * GIB // (819_200 * 4096)
    out = capacity_for(32, 8, 128, "float16", 4096, 10.0)
    assert out["bytes_per_token"] == 131_072 and out["bytes_per_request"] == 512 * 2 ** 20
    assert out["requests"] == 20 and out["tokens"] == 10 * GIB // 131_072
    assert capacity_for(32, 8, 128, "float16", 4097, 10.0, block_size=16)["bytes_per_request"] == 131_072 * 4112


def test_format_bytes():
    assert format_bytes(46_080) == "45 KiB"
    assert format_bytes(6_710_886_400) == "6.25 GiB"
    assert format_bytes(512) == "512 B"


@pytest.mark.parametrize("cfg, match", [
    ({"num_attention_heads": 4, "hidden_size": 64}, "num_hidden_layers"),
    ({"num_hidden_layers": 2, "hidden_size": 64}, "num_attention_heads"),
    ({"num_hidden_layers": 2, "num_attention_heads": 4}, "hidden_size"),
    ({"num_hidden_layers": 0, "num_attention_heads": 4, "hidden_size": 64}, "num_hidden_layers must be a positive"),
    ({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": -1, "hidden_size": 64}, "num_key_value_heads"),
    ({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 3, "hidden_size": 64}, "multiple"),
    ({"num_hidden_layers": 2, "num_attention_heads": 5, "hidden_size": 64}, "head_dim"),
])
def test_bad_hf_configs(cfg, match):
    with pytest.raises(ValueError, match=match):
        kv_spec(cfg, "fp16")


def test_bad_inputs():
    llama = KNOWN_CONFIGS["Llama-2-7B"]
    with pytest.raises(ValueError, match="unknown dtype 'float12'"):
        bytes_per_token(llama, "float12")
    with pytest.raises(ValueError, match="no dtype"):
        bytes_per_token(llama)
    with pytest.raises(ValueError, match="positive number"):
        bytes_per_token(llama, -2)
    with pytest.raises(ValueError, match="context must be a positive integer"):
        bytes_per_request(llama, 0, "fp16")
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        bytes_per_request(llama, 10, "fp16", block_size=0)
    with pytest.raises(ValueError, match="memory budget"):
        requests_that_fit(llama, -1, 10, "fp16")
    with pytest.raises(TypeError, match="Config"):
        kv_spec([32, 32, 128])
    with pytest.raises(ValueError, match="budget_gib"):
        capacity_for(2, 1, 4, "fp32", 10, 0)


def test_capacity_widget():
    from tinydecoder.widgets import capacity_text, capacity_widget

    box = capacity_widget()
    assert box.data["bytes_per_token"] == 46_080  # SmolLM2 in float32, the defaults
    assert {w.description for w in box.controls.values()} >= {"layers", "KV heads", "head dim", "dtype"}
    box.controls["dtype"].value = "float16"
    assert box.data["bytes_per_token"] == 23_040
    box.controls["n_kv_heads"].value = 9  # as if SmolLM2 had no GQA
    assert box.data["bytes_per_token"] == 69_120
    text = capacity_text(box.data, **box.data["values"])
    assert "69,120 B" in text and "2 x 30 layers x 9 KV heads x 64 x 2 B" in text
