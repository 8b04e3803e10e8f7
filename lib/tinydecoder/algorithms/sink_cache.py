"""Long context with a bounded cache: attention sinks + a sliding window (StreamingLLM).

A dense KV cache grows by one row per token forever. `SinkCache` keeps only the first `sinks`
positions (the *attention sinks*: trained models park spare attention weight on the first
token) and the last `window` positions, and evicts everything in between, so its memory is
bounded by sinks + window rows per layer however long the stream runs. `sinks=0` gives plain
window attention, the baseline whose perplexity blows up once position 0 is evicted
(Xiao et al., 2023, "Efficient Streaming Language Models with Attention Sinks").

Positions are assigned *within the cache*: a token's RoPE position is its slot, not its place in
the stream, so the model never sees a position larger than sinks + window. Sliding-window
attention as a model design (Mistral's rolling buffer) has its capacity helper at the end.
"""
from __future__ import annotations

import numpy as np

from .. import fast
from ..core.cache import HeldBytes, check_made_for, common_length
from ..core.config import Config
from ..core.validate import check_token_ids, is_int
from ..fast.rope_tables import rope_tables, rotate_with_tables


def _count(value, name: str, minimum: int) -> int:
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def kept_positions(tokens_seen: int, sinks: int, window: int) -> np.ndarray:
    """Stream positions a sink cache holds after `tokens_seen` tokens, in slot order: the first
    `sinks` and the last `window` (all of them while tokens_seen <= sinks + window).  -> [held]"""
    seen = _count(tokens_seen, "tokens_seen", 0)
    sinks, window = _count(sinks, "sinks", 0), _count(window, "window", 1)
    if seen <= sinks + window:
        return np.arange(seen)
    return np.concatenate([np.arange(sinks), np.arange(seen - window, seen)])


class SinkCache(HeldBytes):
    """K and V of the first `sinks` and the last `window` positions, per layer; usable wherever a
    `KVCache` is (`forward`, `generate`). Its arrays hold sinks + window rows, allocated once.

    Keys are stored *before* RoPE. `forward` rotates a new key at position len(cache) + i, the
    slot it would take in a cache that evicts nothing; `append` rotates it back (RoPE is a
    rotation, so rotating by -position undoes it, exactly up to float rounding), evicts the
    oldest window rows to make room, and returns the keys rotated at slot + e, where e is the
    number of rows evicted in this step. That frame puts each new key at the very position
    forward gave its query, and every other key at its slot shifted by the same e: attention
    only sees the differences (RoPE's relative property), so each query sees exactly the
    distances StreamingLLM assigns (query slot - key slot). Why unrotated storage rather than
    re-rotating the kept keys by -e at each eviction: a key is rotated back once, not hundreds
    of times, so float error does not accumulate over a long stream, and the stored rows do not
    depend on when they were written. The cost is one rotation of the held keys per layer and
    step (sinks + window rows: cheap next to the weights a decode step reads).

    A step of n new tokens must fit next to the sinks: n <= sinks + window - min(held, sinks)
    (else a clear error before anything changes; feed a long text with `stream_forward`). With
    n > 1 after eviction has begun, the step's early queries see the cache as it is after the
    whole step's eviction: feed one token at a time (piece=1) for exact StreamingLLM."""

    def __init__(self, config: Config, sinks: int = 4, window: int = 252, dtype=np.float32):
        if not isinstance(config, Config):
            raise TypeError(f"config must be a tinydecoder Config, got {type(config).__name__}")
        self.sinks = _count(sinks, "sinks", 0)
        self.window = _count(window, "window", 1)
        if self.sinks + self.window > config.max_context:
            raise ValueError(f"sinks + window = {self.sinks + self.window} exceeds the model's context "
                             f"limit {config.max_context}; a sink cache must be smaller than the context")
        self.config, self.dtype = config, np.dtype(dtype)
        shape = (self.sinks + self.window, config.n_kv_heads, config.head_dim)
        self.k = [np.zeros(shape, self.dtype) for _ in range(config.n_layers)]  # L x [C, Hkv, d], unrotated
        self.v = [np.zeros(shape, self.dtype) for _ in range(config.n_layers)]
        self.lengths = [0] * config.n_layers  # rows held per layer
        self.seen = [0] * config.n_layers  # tokens appended per layer since the start
        self._tables = {}  # RoPE cos/sin by (first, last, count) position: one step's layers share them

    @property
    def capacity(self) -> int:
        return self.sinks + self.window

    def __len__(self) -> int:
        """Positions held (<= sinks + window); forward places new tokens after them."""
        return common_length(self.lengths, "sink cache", "make a new SinkCache")

    @property
    def tokens_seen(self) -> int:
        """Tokens fed since the start, evicted ones included (generate resumes from here)."""
        return common_length(self.seen, "sink cache", "make a new SinkCache")

    @property
    def kept_positions(self) -> np.ndarray:
        """Stream positions of the held rows, in slot order.  -> [len(self)]"""
        return kept_positions(self.tokens_seen, self.sinks, self.window)

    def check(self, config: Config, dtype=None) -> None:
        check_made_for("sink cache", self.config, self.dtype, config, dtype,
                       "make a new SinkCache(model.config, ...) for this model")

    def _rotate(self, x, positions):
        """x [n, Hkv, d] rotated by RoPE at `positions` (consecutive, rising or falling). Every layer
        of a step rotates by the same positions, so their cos/sin are computed once per step."""
        cfg = self.config
        if cfg.position != "rope" or len(positions) == 0:
            return x
        key = (int(positions[0]), int(positions[-1]), len(positions))
        if key not in self._tables:
            if len(self._tables) >= 4:  # this step's two position ranges, and the last step's
                self._tables.clear()
            self._tables[key] = rope_tables(cfg, positions, self.dtype)
        return rotate_with_tables(x, self._tables[key], cfg.rope_layout).astype(self.dtype, copy=False)

    def append(self, layer: int, k_new, v_new):
        """Store n new rows of `layer` (evicting the oldest window rows if needed); return K, V of
        the held positions [T, Hkv, d], K rotated as the class docstring explains."""
        n, held = k_new.shape[0], self.lengths[layer]
        room = self.capacity - min(held, self.sinks)
        if n > room:
            raise ValueError(f"{n} new tokens do not fit in a sink cache of {self.sinks} sinks + "
                             f"{self.window} window holding {held}: at most {room} per step. Feed long "
                             f"text in pieces with stream_forward(model, ids, cache, piece=...)")
        k_new = self._rotate(k_new, -(held + np.arange(n)))  # undo forward's rotation  [n, Hkv, d]
        evict = max(0, held + n - self.capacity)  # the oldest window rows, just after the sinks
        if evict:
            s = self.sinks
            for store in (self.k, self.v):  # slide the window down (numpy copies overlaps safely)
                store[layer][s:held - evict] = store[layer][s + evict:held]
            held -= evict
        self.k[layer][held:held + n] = k_new
        self.v[layer][held:held + n] = v_new
        held += n
        self.lengths[layer], self.seen[layer] = held, self.seen[layer] + n
        k_all = self._rotate(self.k[layer][:held], np.arange(held) + evict)  # [T, Hkv, d]
        return k_all, self.v[layer][:held]

    def keys(self, layer: int) -> np.ndarray:
        """The held keys of `layer` rotated at their slot positions 0..len-1, as a fresh prefill
        of the kept tokens would cache them.  -> [len, Hkv, d]"""
        held = self.lengths[layer]
        return self._rotate(self.k[layer][:held], np.arange(held))

    def truncate(self, length: int) -> None:
        """Forget positions from `length` on; only before any eviction (evicted rows are gone)."""
        if self.tokens_seen != len(self):
            raise ValueError("cannot truncate a sink cache that has evicted positions: the stream "
                             "positions it dropped cannot be restored; make a new SinkCache")
        if not 0 <= length <= len(self):
            raise ValueError(f"cannot truncate a cache of {len(self)} positions to {length}")
        self.lengths = [length] * self.config.n_layers
        self.seen = [length] * self.config.n_layers


def stream_forward(model, token_ids, cache: SinkCache, piece: int = 1) -> np.ndarray:
    """Logits [N, V] for a long text fed through a bounded cache: first as many tokens as fit
    without eviction in one prefill (exact), then `piece` tokens per forward call (1 = decode,
    StreamingLLM's setting). Runs on the fast path (`fast.forward`, equal to the reference
    `forward` with a sink cache; tests/algorithms/test_sink_cache.py)."""
    if not isinstance(cache, SinkCache):
        raise TypeError(f"stream_forward needs a SinkCache, got {type(cache).__name__}")
    piece = _count(piece, "piece", 1)
    if piece > cache.window:
        raise ValueError(f"piece={piece} must be <= the window ({cache.window}) to fit next to the sinks")
    ids = check_token_ids(model.config, token_ids)
    first = min(len(ids), cache.capacity - len(cache))
    bounds = [0] + ([first] if first else []) + list(range(first + piece, len(ids), piece)) + [len(ids)]
    return np.concatenate([fast.forward(model, ids[a:b], cache) for a, b in zip(bounds[:-1], bounds[1:]) if b > a])


def next_token_nll(logits, token_ids) -> np.ndarray:
    """Negative log-likelihood of each next token: nll[i] = -log softmax(logits[i])[ids[i+1]].
    logits [N, V], ids [N]  ->  [N-1] float64 (perplexity = exp(mean))."""
    logits = np.asarray(logits, dtype=np.float64)
    ids = np.asarray(token_ids)
    if logits.ndim != 2 or len(ids) != logits.shape[0] or len(ids) < 2:
        raise ValueError(f"need logits [N, V] and N >= 2 token ids, got {logits.shape} and {len(ids)} ids")
    z = logits[:-1]
    top = z.max(axis=1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))  # [N-1]
    return log_norm - z[np.arange(len(z)), ids[1:]]


def rolling_buffer_slots(tokens: int, window: int) -> np.ndarray:
    """Which stream position each slot of a rolling buffer of `window` slots holds after `tokens`
    tokens (position p lives in slot p % window); -1 for a slot not yet written.  -> [window]"""
    tokens, window = _count(tokens, "tokens", 0), _count(window, "window", 1)
    slots = np.full(window, -1)
    recent = np.arange(max(0, tokens - window), tokens)
    slots[recent % window] = recent
    return slots
