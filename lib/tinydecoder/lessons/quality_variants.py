"""The approximations `python -m tinydecoder eval` scores, each built from the module that
teaches it (nothing re-implemented here):

- weights "f32": the dequantised weights as loaded (the reference). "q4_1": the file's own Q4_1
  blocks read in place (`load_smollm2("q4_1")`, passed to `build_runner` as `quantized`): the
  same weights, other sums (per block, d * sum(q x) + m * sum(x)), so it differs from "f32" by
  float32 rounding only, which eval measures like any other variant. "q8_0": every matrix (and the tied
  embedding) re-quantised to Q8_0 blocks of 32 along its input dimension (`gguf.quants`, the
  format llama.cpp reads) and dequantised. "int4-nogroup": the bad example, 4 bits with ONE
  min/max scale per whole matrix row (all 576 or 1,536 inputs of an output), the rule of
  `algorithms.kv_quant.quantize` without Q4_1's groups of 32;
- kv "int8" / "int4": `algorithms.kv_quant.QuantizedKVCache` on KIVI's axes (keys per channel,
  values per token, groups of 32). A window is one prefill through the cache, so every key and
  value attended to, the window's own included, is read back quantised (the last, not yet full,
  group of keys waits in float32 as in decoding); a per-channel key group's min/max also covers
  the up to 31 later positions of its group, as in any prefill of that cache;
- sinks N + window W: `algorithms.sink_cache.SinkCache` fed by `stream_forward`: a window's first
  N + W tokens in one exact prefill, then `piece` tokens per forward (1 = StreamingLLM exactly;
  with piece p > 1 the first queries of a step see up to p - 1 fewer window positions);
- piece P without a window: each window fed P tokens per forward through its cache instead of in
  one prefill, as decoding feeds it (P = 1: every token a decode step; the q4_1 model then runs
  its decode kernels, whose sums a prefill's dense product does not share);
- experts K: `lessons.moefication` (16 experts per layer, learned router) calibrated on the
  shipped calibration text (other topics than the scored ones), run through the reference forward
  with its `ffn=` parameter, K of 16 experts per token;
- early-exit L: `decoding.drafts.early_exit_model`, the first L blocks then the final norm and
  the tied head (chapter 15's early-exit draft).

Variants compose where their pieces do: weights with everything; kv or sinks (one cache); experts
with kv (the reference forward takes any cache) but not with sinks (the sink stream runs on the
fast path, which has no `ffn=`); early-exit with any.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .. import fast
from ..algorithms.kv_quant import QuantizedKVCache, dequantize, quantize
from ..algorithms.sink_cache import SinkCache, stream_forward
from ..core import reference
from ..core.model import LayerWeights, Model
from ..decoding.drafts import early_exit_model

WEIGHTS = ("f32", "q4_1", "q8_0", "int4-nogroup")
KV_BITS = {"int8": 8, "int4": 4}
N_EXPERTS = 16  # MoEfication's experts per layer (lessons.moefication, notebook 24)
CALIBRATION_TOKENS = 256  # per calibration topic, as notebook 24 calibrates


@dataclass(frozen=True)
class Variant:
    weights: str = "f32"
    kv: str | None = None
    sinks: int | None = None
    window: int | None = None
    experts: int | None = None
    early_exit: int | None = None
    piece: int | None = None  # tokens per forward (module docstring); None: one prefill (a window: 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def is_reference(self) -> bool:
        """True when it computes exactly what the float32 model does (KL 0 without a second pass)."""
        return self.to_dict() == Variant().to_dict()

    def check(self, n_layers: int = 30) -> Variant:
        """self, or a clear error naming the flag and what is allowed."""
        if self.weights not in WEIGHTS:
            raise ValueError(f"--weights must be one of {', '.join(WEIGHTS)}, got {self.weights!r}")
        if self.kv is not None and self.kv not in KV_BITS:
            raise ValueError(f"--kv must be one of {', '.join(KV_BITS)}, got {self.kv!r}")
        if self.sinks is not None and self.window is None:
            raise ValueError("--sinks N needs --window W (the recent positions kept beside the N sinks)")
        if self.sinks is not None and self.sinks < 0:
            raise ValueError(f"--sinks must be an integer >= 0, got {self.sinks}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"--window must be an integer >= 1, got {self.window}")
        if self.piece is not None and self.window is not None and not 1 <= self.piece <= self.window:
            raise ValueError(f"--piece must be in 1..window ({self.window}), got {self.piece}")
        if self.piece is not None and self.piece < 1:
            raise ValueError(f"--piece (tokens per forward) must be an integer >= 1, got {self.piece}")
        if self.experts is not None and not 1 <= self.experts <= N_EXPERTS:
            raise ValueError(f"--experts must be in 1..{N_EXPERTS} (of MoEfication's {N_EXPERTS} experts per "
                             f"layer), got {self.experts}")
        if self.early_exit is not None and not 1 <= self.early_exit <= n_layers:
            raise ValueError(f"--early-exit must be in 1..{n_layers} (layers kept; {n_layers} is the whole "
                             f"model), got {self.early_exit}")
        if self.kv is not None and self.window is not None:
            raise ValueError("--kv and --sinks/--window each choose the KV cache: pick one")
        if self.experts is not None and self.window is not None:
            raise ValueError("--experts runs on the reference forward (its ffn= parameter), the sink stream on the "
                             "fast path: they cannot be combined")
        return self


# ----------------------------------------------------------------------------- weights

def _blocks_q8_0(rows) -> np.ndarray:
    """rows (out, in) float32 through Q8_0 (blocks of 32 along `in`) and back (gguf.quants)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize
    from gguf.quants import quantize as gguf_quantize

    q8 = GGMLQuantizationType.Q8_0
    return gguf_dequantize(gguf_quantize(np.ascontiguousarray(rows, np.float32), q8), q8).reshape(rows.shape)


def _rows_int4(rows) -> np.ndarray:
    """rows (out, in) through 4-bit min/max codes with one scale and zero per whole row."""
    codes, scale, zero = quantize(rows, bits=4, axis=1)
    return dequantize(codes, scale, zero, np.float32)


RULES = {"q8_0": _blocks_q8_0, "int4-nogroup": _rows_int4}


def requantized_model(model: Model, weights: str) -> Model:
    """`model` with every matrix (and the tied embedding) through the rule `weights`, keeping
    each array's shape and memory order; norms stay float32. Rows are output features: a
    matrix's [in, out] array is quantised along `in`, the embedding [V, D] along D."""
    if weights not in RULES:
        raise ValueError(f"requantized_model: weights must be one of {', '.join(RULES)}, got {weights!r}")
    rule = RULES[weights]

    def matrix(w):  # [in, out] -> the same, quantised per output along `in`
        return rule(np.asarray(w).T).T

    layers = [LayerWeights(w_qkv=matrix(layer.w_qkv), wo=matrix(layer.wo), w_gate_up=matrix(layer.w_gate_up),
                           w_down=matrix(layer.w_down), attn_norm=layer.attn_norm, ffn_norm=layer.ffn_norm)
              for layer in model.layers]
    lm_head = None if model.config.tied_embeddings else matrix(model.lm_head)
    return Model(model.config, embed=rule(np.asarray(model.embed)), layers=layers, final_norm=model.final_norm,
                 pos_table=model.pos_table, lm_head=lm_head)


def weights_model(model: Model, weights: str, quantized: Model | None = None) -> Model:
    """The model a variant's weights give: `model` itself ("f32"), the file's blocks ("q4_1": the
    `quantized` model, which only the model's file can give), or `model` re-quantised."""
    if weights == "f32":
        return model
    if weights == "q4_1":
        if quantized is None:
            raise ValueError("--weights q4_1 reads the model file's own Q4_1 blocks: pass the quantised model "
                             "(checkpoint.smollm2.load_smollm2('q4_1')) as `quantized`")
        return quantized
    return requantized_model(model, weights)


# ----------------------------------------------------------------------------- runners

def calibration_sequences(tokenizer, text_name=None) -> list:
    """The shipped calibration text's topics, the first CALIBRATION_TOKENS tokens of each."""
    from .quality import CALIBRATION_TEXT, shipped_text, text_sources, topic_text

    topics = text_sources()["files"][text_name or CALIBRATION_TEXT]["topics"]
    shipped_text(text_name or CALIBRATION_TEXT)  # a clear error if it is missing
    return [tokenizer.encode(topic_text(t))[:CALIBRATION_TOKENS] for t in topics]


def moefied_ffn(model: Model, calibration, k: int, seed: int = 0):
    """MoEfication of `model` (16 experts per layer, calibrated on `calibration`: token-id lists),
    as an ffn(l, layer, z) running k experts per token with the learned router."""
    from . import moefication as mf

    return mf.moefy(model, mf.calibration_inputs(model, calibration), n_experts=N_EXPERTS, seed=seed).ffn(k)


def build_runner(model: Model, variant: Variant, calibration=None, quantized: Model | None = None):
    """fn(window_ids) -> logits [len, V] float32 of `variant`, a fresh cache per call. quantized:
    the same network on its file's Q4_1 blocks, for weights "q4_1"."""
    variant = variant.check(model.config.n_layers)
    m = weights_model(model, variant.weights, quantized)
    if variant.early_exit is not None and variant.early_exit < model.config.n_layers:
        m = early_exit_model(m, variant.early_exit)
    ffn = None
    if variant.experts is not None:
        if calibration is None:
            raise ValueError("--experts needs calibration text (token-id lists) to cluster and route the experts")
        ffn = moefied_ffn(m, calibration, variant.experts)

    def forward(ids, cache):
        return reference.forward(m, ids, cache, ffn=ffn) if ffn is not None else fast.forward(m, ids, cache)

    def run(ids):
        if variant.window is not None:
            return stream_forward(m, ids, SinkCache(m.config, variant.sinks or 0, variant.window),
                                  piece=variant.piece or 1)
        cache = None if variant.kv is None else QuantizedKVCache(m.config, KV_BITS[variant.kv], "channel", "token")
        if variant.piece is None:
            return forward(ids, cache)
        cache = m.new_cache(len(ids)) if cache is None else cache
        return np.concatenate([forward(ids[i:i + variant.piece], cache) for i in range(0, len(ids), variant.piece)])

    return run


def reference_runner(model: Model):
    """The float32 model on the fast path: what every variant is compared with."""
    return lambda ids: fast.forward(model, ids)
