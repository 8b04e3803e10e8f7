"""Decoding strategies on top of a forward pass: generate, sampling, logits processors, beam search,
speculative decoding and its drafts."""
