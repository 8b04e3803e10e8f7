"""The models a command or the server can run, chosen by name in this one place.

    "toy"      the worked example's decoder (core.toy): no tokenizer, its "text" is token ids ("0 1 2 3")
    "smollm2"  SmolLM2-135M-Instruct (checkpoint.smollm2): byte-level BPE, a chat template, and two
               tokens that end a reply (<|im_end|>, <|endoftext|>)

    chosen = open_model("smollm2")          # the model, its tokenizer and its stop tokens
    ids = chosen.encode("Hi", chat=True)    # the prompt's ids (the toy: "0 1 2" -> [0, 1, 2])
    chosen.decode(new_ids)                  # text without stop tokens (the toy: "3 4 5")

    load_model("toy")                       # the weights only
    open_model("smollm2", weights="q4_1")   # SmolLM2 on the GGUF file's own Q4_1 blocks

`weights` chooses how SmolLM2's matrices are held: "f32" (float32, dequantised once into a cache)
or "q4_1" (the file's Q4_1 blocks, read in place by the fast path); None: DEFAULT_WEIGHTS
(`generate`'s one stream: ONE_STREAM_WEIGHTS). The toy has float32 weights only.

Where a command needs another toy (the bench measures a float32 toy with room for long
contexts), it passes `toy=` a function that builds it; the name is still checked here.
"""
from __future__ import annotations

from dataclasses import dataclass

MODEL_NAMES = ("smollm2", "toy")
WEIGHTS = ("f32", "q4_1")
# SmolLM2's weights when none are named. Decoding few rows a step (`generate`'s one stream; `serve`
# with at most SERVE_Q4_1_UP_TO_BATCH requests running): ONE_STREAM_WEIGHTS, the file's Q4_1 blocks,
# whose decode step reads a fifth of the bytes. Passes over many rows of one sequence (generate's
# --speculative and --beams), float32 shards (--tensor-parallel) and bench's main table (its targets
# are float32's): DEFAULT_WEIGHTS. Measured on a 2-vCPU AMD EPYC Zen 5 VM, December 2026: `bench
# --model smollm2` q4_1 decode at context 128 261-325 tokens/s (a step's row by quant_planes'
# lookups, every layer in one compiled call), 3.3-4.1x float32's (the ratio follows float32's
# bandwidth-bound speed, 74-83 tokens/s those runs; 71-114 seen); a pass over 8 rows 2.6-2.8 of
# q4_1's steps (float32's: 1.1-1.7), above its arithmetic floor of 1.1-1.5 (perf.weights_bench.
# pass_floor at the cores' multiply-add peak). serve's engine (token budget 80, 16 running, chunks
# of 64; 48-token prompts, 48 new tokens each; medians of 3 alternating runs): 1 request q4_1 248
# tokens/s against f32 74, 4 requests 344 against 194, 16 448 against 464 (earlier, before a pass
# ran its layers in one call: 1 request 178 against 82, 4 243 / 169, 8 296 / 277, 12 305 / 289,
# 16 304 / 319).
DEFAULT_WEIGHTS = "f32"
ONE_STREAM_WEIGHTS = "q4_1"
SERVE_Q4_1_UP_TO_BATCH = 16


def serve_weights(max_batch: int) -> str:
    """serve's default: one_stream_weights() while at most SERVE_Q4_1_UP_TO_BATCH requests run at
    once (as fast as float32 at 16, faster below; a fifth of the memory), else DEFAULT_WEIGHTS (more
    rows a step, bound by arithmetic, which float32's register tiles run faster than decoding blocks)."""
    return one_stream_weights() if max_batch <= SERVE_Q4_1_UP_TO_BATCH else DEFAULT_WEIGHTS


def one_stream_weights() -> str:
    """generate's default for one stream: ONE_STREAM_WEIGHTS where the fast path's kernels run
    (numba, the [fast] extra); without them a Q4_1 product would dequantise its whole matrix in
    numpy at every step, so float32 (DEFAULT_WEIGHTS)."""
    from ..fast.compiled import jit

    return ONE_STREAM_WEIGHTS if jit.available() else DEFAULT_WEIGHTS


def check_model_name(name) -> str:
    """`name` if it is a known model; otherwise a ValueError naming the choices."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose 'toy' or 'smollm2'")
    return name


def check_weights(name: str, weights, default: str = DEFAULT_WEIGHTS) -> str:
    """The weights to load for model `name`: `weights`, or `default` when None (the toy: "f32");
    a ValueError naming the choices otherwise."""
    if weights is None:
        return default if check_model_name(name) == "smollm2" else "f32"
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")
    if weights != "f32" and check_model_name(name) != "smollm2":
        raise ValueError(f"weights {weights!r} need the GGUF file's blocks: use --model smollm2 (the toy has f32 only)")
    return weights


@dataclass
class ChosenModel:
    """A model ready to run, with what turns text into its prompt and its tokens back into text."""

    name: str
    model: object
    tokenizer: object | None  # None for the toy (its text is token ids)
    stop_tokens: tuple  # ids that end a reply (the toy has none)

    @property
    def has_text(self) -> bool:
        """Whether the model has a tokenizer (grammars and response formats need one)."""
        return self.tokenizer is not None

    def encode(self, prompt: str, chat: bool = False) -> list:
        """The prompt's token ids; `chat` writes it as one user message with the chat template."""
        if self.tokenizer is None:
            return toy_prompt_ids(prompt, chat)
        tok = self.tokenizer
        ids = tok.encode_chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
        if not ids:
            raise ValueError("the prompt is empty: give some text to continue")
        return ids

    def decode(self, ids) -> str:
        """The text of `ids`, stop tokens left out (the toy: its ids separated by spaces)."""
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return self.tokenizer.decode([i for i in ids if i not in self.stop_tokens])

    def piece_writer(self):
        """A function token -> the text it adds when streamed (the toy: " 3"; a stop token: "")."""
        if self.tokenizer is None:
            return lambda token: f" {token}"
        stream = self.tokenizer.stream()
        return lambda token: "" if token in self.stop_tokens else stream.step(token)


def toy_prompt_ids(prompt: str, chat: bool = False) -> list:
    """The toy model's prompt: token ids separated by spaces (it has no tokenizer or chat template)."""
    if chat:
        raise ValueError("--chat needs a model with a chat template: use --model smollm2")
    try:
        return [int(t) for t in prompt.split()]
    except ValueError:
        raise ValueError(f"--model toy takes token ids separated by spaces (e.g. \"0 1 2 3\"), "
                         f"got {prompt!r}") from None


def load_model(name: str, *, toy=None, weights=None):
    """The weights of model `name` ("toy" or "smollm2"), without its tokenizer. toy: a function
    that builds the toy model to use (default core.toy.toy_model, float64 as in the seed).
    weights: "f32" or "q4_1" (SmolLM2 only), None for the default (`check_weights`)."""
    weights = check_weights(name, weights)
    if name == "toy":
        from ..core.toy import toy_model

        return (toy or toy_model)()
    from .smollm2 import load_smollm2

    return load_smollm2(weights)


def open_model(name: str, *, toy=None, weights=None) -> ChosenModel:
    """Model `name` with its tokenizer and stop tokens (toy, weights: as for load_model)."""
    weights = check_weights(name, weights)  # before anything loads
    tokenizer = open_tokenizer(name)  # before the weights
    return ChosenModel(name, load_model(name, toy=toy, weights=weights), tokenizer, stop_tokens_of(name))


def open_tokenizer(name: str):
    """The tokenizer of model `name` without loading its weights (None for the toy)."""
    if check_model_name(name) == "toy":
        return None
    from .smollm2 import smollm2_tokenizer

    return smollm2_tokenizer()


def stop_tokens_of(name: str) -> tuple:
    """The ids that end a reply of model `name` (none for the toy)."""
    if check_model_name(name) == "toy":
        return ()
    from .smollm2 import ENDOFTEXT_ID, IM_END_ID

    return (IM_END_ID, ENDOFTEXT_ID)
