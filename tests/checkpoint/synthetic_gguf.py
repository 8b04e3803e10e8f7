"""Small synthetic GGUF files for the checkpoint tests, written with gguf.GGUFWriter the way
llama.cpp's converter writes a Llama model (a helper module, not a test file)."""
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

import tinydecoder as td
from tinydecoder.checkpoint import gguf_file as gf
from tinydecoder.checkpoint.tokenizer import byte_decoder

CFG = td.Config(vocab_size=262, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, n_layers=2, d_ff=96,
                max_context=128, position="rope", rope_base=10000.0, rope_layout="halves", norm_eps=1e-5,
                norm_scale=True, tied_embeddings=True, name="tiny-llama")
IDS = [5, 17, 200, 3, 99, 42, 7]


def tiny_tokens():
    """3 control tokens, the 256 byte-level symbols, and 3 merged tokens."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    symbols = sorted(byte_decoder(), key=byte_decoder().get)  # in byte order
    return specials + symbols + ["Ġt", "he", "Ġthe"], [3, 3, 3] + [1] * 259, ["Ġ t", "h e", "Ġt he"]


def write_llama_gguf(path, model, *, qtype=T.F32, arch="llama", tokenizer=True, skip=(), extra=None,
                     metadata_skip=(), tensor_override=None):
    """Write `model` (HF layout: RoPE "halves") the way llama.cpp's converter does: GGUF
    metadata, tensors as (out, in) arrays, Q and K rows permuted per head."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    meta = {"block_count": lambda: w.add_block_count(cfg.n_layers),
            "context_length": lambda: w.add_context_length(cfg.max_context),
            "embedding_length": lambda: w.add_embedding_length(cfg.d_model),
            "feed_forward_length": lambda: w.add_feed_forward_length(cfg.d_ff),
            "head_count": lambda: w.add_head_count(cfg.n_heads),
            "head_count_kv": lambda: w.add_head_count_kv(cfg.n_kv_heads),
            "rope_freq_base": lambda: w.add_rope_freq_base(cfg.rope_base),
            "rms_eps": lambda: w.add_layer_norm_rms_eps(cfg.norm_eps),
            "rope_dim": lambda: w.add_rope_dimension_count(cfg.head_dim),
            "vocab_size": lambda: w.add_vocab_size(cfg.vocab_size)}
    w.add_name(cfg.name)
    for key, add in meta.items():
        if key not in metadata_skip:
            add()
    if tokenizer:
        tokens, types, merges = tiny_tokens()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    tensors = {"token_embd.weight": model.embed, "output_norm.weight": model.final_norm}
    if not cfg.tied_embeddings:
        tensors["output.weight"] = model.lm_head.T
    for l, layer in enumerate(model.layers):
        tensors.update({
            f"blk.{l}.attn_norm.weight": layer.attn_norm, f"blk.{l}.ffn_norm.weight": layer.ffn_norm,
            f"blk.{l}.attn_q.weight": gf.permute_qk(layer.wq.T, cfg.n_heads),
            f"blk.{l}.attn_k.weight": gf.permute_qk(layer.wk.T, cfg.n_kv_heads),
            f"blk.{l}.attn_v.weight": layer.wv.T, f"blk.{l}.attn_output.weight": layer.wo.T,
            f"blk.{l}.ffn_gate.weight": layer.w_gate.T, f"blk.{l}.ffn_up.weight": layer.w_up.T,
            f"blk.{l}.ffn_down.weight": layer.w_down.T})
    tensors.update(extra or {})
    for name, array in tensors.items():
        if name in skip:
            continue
        array = np.ascontiguousarray(array, dtype=np.float32)
        if tensor_override and name in tensor_override:
            data, raw = tensor_override[name]
            w.add_tensor(name, data, raw_dtype=raw)
        elif array.ndim == 2 and qtype != T.F32:
            w.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, array)  # norms stay F32, as in llama.cpp's files
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
