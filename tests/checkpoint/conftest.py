"""Fixtures of the checkpoint tests: a small random model and its synthetic GGUF file."""
import numpy as np
import pytest
from synthetic_gguf import CFG, write_llama_gguf

from tinydecoder.core.toy import random_model


@pytest.fixture(scope="module")
def reference():
    """A small random Llama model (float32), the source of the synthetic files."""
    return random_model(CFG, seed=3, dtype=np.float32, scale=0.3)


@pytest.fixture
def tiny_file(tmp_path, reference):
    """`reference` written as a GGUF file (float32 tensors)."""
    return write_llama_gguf(tmp_path / "tiny.gguf", reference)
