"""tinydecoder: a small numpy decoder for learning how an LLM executes a request.

Sub-packages, each importing only from those before it:
    core        the decoder as the math reads: config, model (the weights as data), validate, ops, reference
                (the forward pass), caches, RoPE's layouts, toy, trace; it imports nothing compiled
    fast        the same numbers, faster: the forward pass in fewer calls, batched caches, fused blocks,
                and compiled/ (the numba kernels)
    decoding    strategies on top of a forward pass: generate, sampling, processors, beam, speculative, grammar
    algorithms  Part II's algorithms: flash attention, quantized KV cache, attention-sink cache
    checkpoint  a real model from its GGUF file: config, weights, tokenizer, SmolLM2
    serving     many requests: KV capacity, the paged cache, chunked prefill, scheduling, the engine
    perf        speed: the benchmark, its targets, this machine's roofs and timers
    lessons     helpers only the notebooks need (heads, phases, bugs, the RoPE lab, ...)
    viz, widgets  figures and interactive widgets for the notebooks
    server, parallel  an OpenAI-compatible HTTP server; MPI ranks (nothing else imports them)
    course      the exercises: check, the "implement it" cases, grading
    cli         the command line (python -m tinydecoder), one module per command
"""
from . import fast
from .algorithms.flash import flash_attention, merge_partials
from .algorithms.kv_quant import QuantizedKVCache
from .algorithms.sink_cache import SinkCache
from .checkpoint.smollm2 import load_smollm2, smollm2_tokenizer
from .core import reference
from .core.cache import KVCache
from .core.config import Config
from .core.kernels import Kernels
from .core.model import LayerWeights, Model
from .core.ops import apply_rope, attention, causal_mask, repeat_kv, rmsnorm, rope_angles, silu, softmax, swiglu
from .core.reference import decoder_block, embed_tokens, forward, layer_input
from .core.reference import forward_batch as forward_each
from .core.toy import SEED_CONTINUATION, SEED_PROMPT, random_model, toy_config, toy_model
from .core.trace import Trace
from .core.validate import check_token_ids
from .decoding.beam import Beam, BeamSearchResult, beam_search, sequence_logprob
from .decoding.generate import Event, Generation, generate, work_counts
from .decoding.grammar import JsonSchema, Lark, Regex
from .decoding.processors import FrequencyPenalty, LogitBias, MaxLength, MinP, PresencePenalty, RepetitionPenalty, StopSequences
from .decoding.sampling import greedy
from .decoding.speculative import speculative_generate
from .fast import forward as forward_fast
from .fast import forward_batch

__all__ = [
    "Config", "Kernels", "KVCache", "QuantizedKVCache", "SinkCache", "LayerWeights", "Model", "Trace", "Event", "Generation",
    "fast", "reference", "load_smollm2", "smollm2_tokenizer",
    "forward", "forward_each", "forward_fast", "forward_batch", "decoder_block", "embed_tokens", "layer_input",
    "generate", "greedy", "work_counts", "check_token_ids",
    "rmsnorm", "softmax", "silu", "swiglu", "attention", "flash_attention", "merge_partials",
    "causal_mask", "repeat_kv", "apply_rope",
    "rope_angles", "toy_model", "toy_config", "random_model", "SEED_PROMPT", "SEED_CONTINUATION",
    "beam_search", "speculative_generate", "Beam", "BeamSearchResult", "sequence_logprob",
    "RepetitionPenalty", "FrequencyPenalty", "PresencePenalty", "MinP", "LogitBias", "StopSequences", "MaxLength",
    "JsonSchema", "Regex", "Lark",
]
