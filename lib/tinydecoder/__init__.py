"""tinydecoder: a small numpy decoder for learning how an LLM executes a request."""
from .cache import KVCache
from .config import Config
from .generate import Event, Generation, generate, greedy, work_counts
from .model import LayerWeights, Model, check_token_ids, decoder_block, embed_tokens, forward, forward_batch, layer_input
from .paged import PagedKVPool, PagedSequence, PoolExhaustedError
from .ops import apply_rope, attention, causal_mask, repeat_kv, rmsnorm, rope_angles, silu, softmax, swiglu
from .speculative import speculative_generate
from .toy import SEED_CONTINUATION, SEED_PROMPT, random_model, toy_config, toy_model
from .trace import Trace

__all__ = [
    "Config", "KVCache", "LayerWeights", "Model", "Trace", "Event", "Generation",
    "forward", "forward_batch", "decoder_block", "embed_tokens", "layer_input", "generate", "greedy", "work_counts", "check_token_ids",
    "rmsnorm", "softmax", "silu", "swiglu", "attention", "causal_mask", "repeat_kv", "apply_rope",
    "rope_angles", "toy_model", "toy_config", "random_model", "SEED_PROMPT", "SEED_CONTINUATION",
    "PagedKVPool", "PagedSequence", "PoolExhaustedError", "speculative_generate",
]
