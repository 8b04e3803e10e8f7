"""The GGUF loader on small synthetic files written with gguf.GGUFWriter: weights land where the
forward reads them (llama.cpp's Q/K permutation undone, or kept with interleaved RoPE), the
config comes from the metadata, the cache is keyed by sha256 and memory-mapped, and every
kind of bad file gets its own clear error."""
import json
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_gguf import CFG, IDS, write_llama_gguf

import tinydecoder as td
from tinydecoder.checkpoint import gguf_file as gf
from tinydecoder.checkpoint import gguf_loader as gl
from tinydecoder.checkpoint import store
from tinydecoder.checkpoint.tokenizer import Tokenizer
from tinydecoder.core.toy import random_model


def load(path, tmp_path, **kw):
    kw.setdefault("progress", False)
    return gl.load_gguf_model(path, cache_root=tmp_path / "cache", **kw)


# ---------------------------------------------------------------- the Q/K permutation
@settings(max_examples=30, deadline=None)
@given(n_heads=st.integers(1, 4), half=st.integers(1, 8), n_in=st.integers(1, 5), seed=st.integers(0, 99),
       position=st.integers(0, 500))
def test_permutation_turns_halves_rope_into_interleaved_rope(n_heads, half, n_in, seed, position):
    """For the same input, rotating HF-layout q with "halves" and llama.cpp-layout q with
    "interleaved" gives the same vector up to llama.cpp's row order: so q . k is unchanged."""
    rng = np.random.default_rng(seed)
    d = 2 * half
    w_hf = rng.standard_normal((n_heads * d, n_in))
    w_cpp = gf.permute_qk(w_hf, n_heads)
    x = rng.standard_normal(n_in)
    q_hf = td.apply_rope((w_hf @ x).reshape(1, n_heads, d), [position], 10000.0, "halves")
    q_cpp = td.apply_rope((w_cpp @ x).reshape(1, n_heads, d), [position], 10000.0, "interleaved")
    permuted = gf.permute_qk(q_hf.reshape(n_heads * d, 1), n_heads).reshape(q_cpp.shape)
    np.testing.assert_allclose(q_cpp, permuted, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(gf.unpermute_qk(w_cpp, n_heads), w_hf)


def test_permutation_moves_row_j_half_plus_i_to_row_2i_plus_j():
    rows = np.arange(2 * 8).reshape(16, 1)  # 2 heads of width 8: HF row index as the value
    cpp = gf.permute_qk(rows, 2)[:, 0]
    assert cpp.tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


# ---------------------------------------------------------------- loading
def test_config_comes_from_the_metadata(tiny_file, tmp_path):
    model = load(tiny_file, tmp_path, use_cache=False)
    assert model.config == CFG
    other = td.Config(**{**CFG.to_dict(), "n_layers": 1, "d_ff": 40, "rope_base": 500.0, "name": "other"})
    path = write_llama_gguf(tmp_path / "other.gguf", random_model(other, seed=1))
    assert load(path, tmp_path, use_cache=False).config == other


@pytest.mark.parametrize("use_cache", [False, True])
def test_loaded_model_computes_the_written_model(tiny_file, tmp_path, reference, use_cache):
    model = load(tiny_file, tmp_path, use_cache=use_cache)
    assert model.dtype == np.float32
    np.testing.assert_array_equal(model.layers[1].wq, reference.layers[1].wq)  # permutation undone
    np.testing.assert_array_equal(model.layers[0].wk, reference.layers[0].wk)
    np.testing.assert_array_equal(model.layers[0].w_down, reference.layers[0].w_down)
    assert np.shares_memory(model.lm_head, model.embed)  # tied: a view
    np.testing.assert_allclose(td.forward(model, IDS), td.forward(reference, IDS), rtol=0, atol=2e-5)


def test_open_gguf_reuses_the_reader_of_an_unchanged_file(tiny_file, tmp_path):
    """Parsing a large GGUF takes seconds, so the last file's reader is kept; a changed file
    (other size, modification time or inode) is parsed again, and damage is still reported."""
    first = gf.open_gguf(tiny_file)
    assert gf.open_gguf(str(tiny_file)) is first  # same file, any spelling of its path
    data = tiny_file.read_bytes()
    stat = tiny_file.stat()
    os.utime(tiny_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched: same bytes, new time
    again = gf.open_gguf(tiny_file)
    assert again is not first and len(again.tensors) == len(first.tensors)
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(data)
    assert gf.open_gguf(copy) is not again
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(gf.GGUFFormatError, match="truncated"):
        gf.open_gguf(cut)


def test_interleaved_layout_keeps_the_file_rows_and_gives_the_same_logits(tiny_file, tmp_path, reference):
    halves = load(tiny_file, tmp_path, use_cache=False)
    reader = gf.open_gguf(tiny_file)
    raw_q = gf.dequantize_tensor(gf.tensor_map(reader)["blk.0.attn_q.weight"])
    for use_cache in (False, True):
        inter = load(tiny_file, tmp_path, rope_layout="interleaved", use_cache=use_cache)
        assert inter.config.rope_layout == "interleaved"
        np.testing.assert_array_equal(inter.layers[0].wq.T, raw_q)  # exactly the file's rows
        assert not np.array_equal(inter.layers[0].wq, halves.layers[0].wq)
        np.testing.assert_allclose(td.forward(inter, IDS), td.forward(halves, IDS), rtol=0, atol=2e-5)


@pytest.mark.parametrize("qtype", [T.F16, T.Q8_0, T.Q4_1, T.Q4_0, T.Q5_1])
def test_quantised_weights_are_dequantised_like_gguf_does(tmp_path, reference, qtype):
    path = write_llama_gguf(tmp_path / "q.gguf", reference, qtype=qtype)
    model = load(path, tmp_path)
    expect = dequantize(quantize(np.ascontiguousarray(reference.layers[1].w_up.T), qtype), qtype)
    np.testing.assert_array_equal(model.layers[1].w_up, expect.T)
    np.testing.assert_array_equal(model.embed, dequantize(quantize(reference.embed, qtype), qtype))
    # quantisation blocks run along `in`, so llama.cpp's row permutation commutes with it: the
    # loaded model is the reference with every matrix rounded through the format
    rounded = lambda w_in_out: dequantize(quantize(np.ascontiguousarray(w_in_out.T), qtype), qtype).T
    expected = td.Model(CFG, rounded(reference.embed.T).T, [td.LayerWeights.from_parts(
        *[rounded(getattr(l, name)) for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")],
        attn_norm=l.attn_norm, ffn_norm=l.ffn_norm) for l in reference.layers], final_norm=reference.final_norm)
    np.testing.assert_allclose(td.forward(model, IDS), td.forward(expected, IDS), rtol=0, atol=2e-5)


def test_untied_output_head(tmp_path):
    cfg = td.Config(**{**CFG.to_dict(), "tied_embeddings": False})
    ref = random_model(cfg, seed=4)
    model = load(write_llama_gguf(tmp_path / "untied.gguf", ref), tmp_path)
    assert model.config.tied_embeddings is False
    np.testing.assert_array_equal(model.lm_head, ref.lm_head)


def test_fused_storage_gives_views_and_the_same_logits(tiny_file, tmp_path):
    model = load(tiny_file, tmp_path)
    layer = model.layers[0]
    assert np.shares_memory(layer.wq, layer.w_qkv) and np.shares_memory(layer.w_up, layer.w_gate_up)
    unfused = td.Model(model.config, model.embed, [td.LayerWeights.from_parts(
        wq=np.array(l.wq), wk=np.array(l.wk), wv=np.array(l.wv), wo=l.wo, w_gate=np.array(l.w_gate),
        w_up=np.array(l.w_up), w_down=l.w_down, attn_norm=l.attn_norm, ffn_norm=l.ffn_norm)
        for l in model.layers], final_norm=model.final_norm)
    assert unfused.n_params == model.n_params  # fused arrays are not counted twice
    cache_a, cache_b = model.new_cache(), unfused.new_cache()
    np.testing.assert_allclose(td.forward(model, IDS, cache_a), td.forward(unfused, IDS, cache_b), atol=1e-5)
    np.testing.assert_allclose(td.forward(model, [9], cache_a), td.forward(unfused, [9], cache_b), atol=1e-5)


# ---------------------------------------------------------------- the cache
def test_cache_is_keyed_by_sha256_written_once_and_memory_mapped(tiny_file, tmp_path, capsys):
    sha = gf.file_sha256(tiny_file)
    first = load(tiny_file, tmp_path, progress=True)
    assert "dequantising" in capsys.readouterr().err  # the progress bar, on stderr
    folder = tmp_path / "cache" / sha
    files = sorted(p.name for p in folder.iterdir())
    assert "manifest.json" in files and "tokenizer.json" in files
    assert all(f.endswith((".npy", ".json")) for f in files)  # nothing pickled
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [sha]  # no partial folder left over
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["sha256"] == sha and manifest["config"] == CFG.to_dict()
    stamp = (folder / "blk.0.attn_qkv.npy").stat().st_mtime_ns
    second = load(tiny_file, tmp_path, progress=True)
    assert capsys.readouterr().err == ""  # no dequantising the second time
    assert (folder / "blk.0.attn_qkv.npy").stat().st_mtime_ns == stamp
    qkv = second.layers[0].w_qkv
    assert isinstance(qkv.base, np.memmap)  # a view of the memory-mapped .npy file
    assert not qkv.flags.writeable  # read-only: the cache cannot be changed by accident
    np.testing.assert_array_equal(second.layers[1].w_gate, first.layers[1].w_gate)
    for name in os.listdir(folder):
        if name.endswith(".npy"):
            np.load(folder / name, allow_pickle=False)


def test_cache_root_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYDECODER_CACHE", str(tmp_path / "here"))
    assert store.cache_dir_for("abc") == tmp_path / "here" / "abc"
    monkeypatch.delenv("TINYDECODER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store.cache_dir_for("abc") == tmp_path / "xdg" / "tinydecoder" / "abc"


def test_tokenizer_comes_with_the_cache(tiny_file, tmp_path):
    tok = gl.load_gguf_tokenizer(tiny_file, cache_root=tmp_path / "cache", progress=False)
    fresh = gl.load_gguf_tokenizer(tiny_file, use_cache=False)
    assert isinstance(tok, Tokenizer) and tok.vocab_size == fresh.vocab_size == 262
    text = "the then<|im_end|>Ωx 12"
    assert tok.encode(text) == fresh.encode(text)
    assert tok.encode("<|im_end|>") == [2] and tok.encode(" the") == [261]
    assert tok.decode(tok.encode(text)) == text
    assert tok.eos_id == 2 and tok.special_ids == (0, 1, 2)


# ---------------------------------------------------------------- errors, each with its own message
def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        load(tmp_path / "nope.gguf", tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.9, 0.999])
def test_truncated_file(tiny_file, tmp_path, keep):
    data = tiny_file.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(gf.GGUFFormatError, match="truncated"):
        load(cut, tmp_path, use_cache=False)
    with pytest.raises(gf.GGUFFormatError, match="truncated"):
        load(cut, tmp_path)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


@pytest.mark.parametrize("content", [b"", b"GGUF", b"not a gguf file at all" * 100])
def test_corrupt_file(tmp_path, content):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(gf.GGUFFormatError, match="truncated or corrupt"):
        load(path, tmp_path)


def test_checksum_mismatch(tiny_file, tmp_path):
    with pytest.raises(gf.ChecksumError, match="sha256 is [0-9a-f]{64}, expected 0{64}"):
        load(tiny_file, tmp_path, expected_sha256="0" * 64)
    good = gf.file_sha256(tiny_file)
    assert load(tiny_file, tmp_path, expected_sha256=good.upper()).config == CFG


def test_unsupported_architecture(tmp_path, reference):
    path = write_llama_gguf(tmp_path / "g.gguf", reference, arch="gpt2")
    with pytest.raises(gf.UnsupportedModelError, match="architecture 'gpt2' is not supported.*llama"):
        load(path, tmp_path)


def test_unsupported_quantisation_type(tmp_path, reference):
    k_quant = np.zeros((CFG.d_ff, 84), np.uint8)  # Q2_K: 84 bytes per block of 256 weights
    path = write_llama_gguf(tmp_path / "k.gguf", reference,
                            tensor_override={"blk.0.ffn_up.weight": (k_quant, T.Q2_K)})
    with pytest.raises(gf.UnsupportedModelError, match="stored as Q2_K, which is not supported.*Q4_1"):
        load(path, tmp_path)


def test_missing_or_extra_tensors_and_metadata(tmp_path, reference):
    path = write_llama_gguf(tmp_path / "a.gguf", reference, skip={"blk.1.ffn_gate.weight"})
    with pytest.raises(gf.UnsupportedModelError, match="no tensor 'blk.1.ffn_gate.weight'"):
        load(path, tmp_path)
    path = write_llama_gguf(tmp_path / "b.gguf", reference, extra={"blk.0.attn_q.bias": np.zeros(64)})
    with pytest.raises(gf.UnsupportedModelError, match="unexpected tensor 'blk.0.attn_q.bias'"):
        load(path, tmp_path)
    path = write_llama_gguf(tmp_path / "c.gguf", reference, metadata_skip={"block_count"})
    with pytest.raises(gf.UnsupportedModelError, match="no 'llama.block_count'"):
        load(path, tmp_path)


def test_bad_rope_layout(tiny_file, tmp_path):
    with pytest.raises(ValueError, match="rope_layout must be 'halves' or 'interleaved'"):
        load(tiny_file, tmp_path, rope_layout="rotated")
