"""tinydecoder: a small numpy decoder for learning how an LLM executes a request.

Sub-packages, each importing only from those before it:
    core        the decoder itself: config, ops, the reference model, its fast path, caches, generation
    checkpoint  a real model from its GGUF file: config, weights, tokenizer, SmolLM2
    serving     many requests: KV capacity, the paged cache, chunked prefill, scheduling, benchmarks
    lessons     helpers only the notebooks need (heads, phases, bugs, exercises, the RoPE lab)
    viz, widgets  figures and interactive widgets for the notebooks
"""
from .core.beam import Beam, BeamSearchResult, beam_search, sequence_logprob
from .core.cache import KVCache
from .core.config import Config
from .core.fast import forward_batch, forward_fast
from .core.flash import flash_attention, merge_partials
from .core.generate import Event, Generation, generate, work_counts
from .core.kv_quant import QuantizedKVCache
from .core.model import LayerWeights, Model, check_token_ids, decoder_block, embed_tokens, forward, forward_each, layer_input
from .core.ops import apply_rope, attention, causal_mask, repeat_kv, rmsnorm, rope_angles, silu, softmax, swiglu
from .core.processors import FrequencyPenalty, LogitBias, MaxLength, MinP, PresencePenalty, RepetitionPenalty, StopSequences
from .core.sampling import greedy
from .core.sink_cache import SinkCache
from .core.speculative import speculative_generate
from .core.toy import SEED_CONTINUATION, SEED_PROMPT, random_model, toy_config, toy_model
from .core.trace import Trace

__all__ = [
    "Config", "KVCache", "QuantizedKVCache", "SinkCache", "LayerWeights", "Model", "Trace", "Event", "Generation",
    "forward", "forward_each", "forward_fast", "forward_batch", "decoder_block", "embed_tokens", "layer_input",
    "generate", "greedy", "work_counts", "check_token_ids",
    "rmsnorm", "softmax", "silu", "swiglu", "attention", "flash_attention", "merge_partials",
    "causal_mask", "repeat_kv", "apply_rope",
    "rope_angles", "toy_model", "toy_config", "random_model", "SEED_PROMPT", "SEED_CONTINUATION",
    "beam_search", "speculative_generate", "Beam", "BeamSearchResult", "sequence_logprob",
    "RepetitionPenalty", "FrequencyPenalty", "PresencePenalty", "MinP", "LogitBias", "StopSequences", "MaxLength",
]
