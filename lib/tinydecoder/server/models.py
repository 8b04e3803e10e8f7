"""What the server serves: a model, its tokenizer (text <-> ids, the chat template, streaming
decode) and its end-of-sequence id. `served_model("smollm2")` is SmolLM2-135M-Instruct with its
ChatML template; `served_model("toy")` is the seed's toy decoder, whose "text" is token ids
written with spaces ("0 1 2 3"), for fast tests of the protocol."""
from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint.registry import MODEL_NAMES, open_model


class ToyTokenizer:
    """The toy model's text: token ids separated by spaces. Its chat template joins the ids of
    every message's content (there are no special tokens to mark roles)."""

    name = "toy"
    eos_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list:
        try:
            ids = [int(t) for t in text.split()]
        except ValueError:
            raise ValueError(f"the toy model's prompt is token ids separated by spaces (0..{self.vocab_size - 1}), "
                             f"got {text[:40]!r}") from None
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise ValueError(f"the toy model's token ids are 0..{self.vocab_size - 1}, got {text[:40]!r}")
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(f" {int(t)}" for t in ids)

    def encode_chat(self, messages) -> list:
        return [t for m in messages for t in self.encode(m["content"])]

    def stream(self, skip_special_tokens: bool = False):
        return _ToyStream()


class _ToyStream:
    def step(self, token_id: int) -> str:
        return f" {int(token_id)}"


@dataclass
class ServedModel:
    name: str  # the id clients put in "model"
    model: object  # a tinydecoder Model (fast path, batched forwards)
    tokenizer: object  # encode, decode, encode_chat, stream().step(id)
    eos_id: int | None
    block_size: int  # KV positions per block of the paged pool

    @property
    def max_context(self) -> int:
        return self.model.config.max_context


def served_model(name: str, weights: str | None = None) -> ServedModel:
    """Load the model the server will serve: "smollm2" (SmolLM2-135M-Instruct, memory-mapped;
    weights "f32" or "q4_1", None: checkpoint.registry's default) or "toy" (the seed's decoder, 64
    positions, ids as text); the name is checkpoint.registry's."""
    if name not in MODEL_NAMES:
        raise ValueError(f"model must be one of {MODEL_NAMES}, got {name!r}")
    chosen = open_model(name, weights=weights)
    if chosen.has_text:
        return ServedModel(name, chosen.model, chosen.tokenizer, chosen.tokenizer.eos_id, 16)
    return ServedModel(name, chosen.model, ToyTokenizer(chosen.model.config.vocab_size), None, 4)
