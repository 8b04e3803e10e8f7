"""Part II's algorithms: FlashAttention's tiling, a quantized KV cache, the attention-sink cache."""
