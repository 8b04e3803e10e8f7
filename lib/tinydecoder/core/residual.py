"""The wiring of a pre-norm decoder block, with its two sublayers given as functions.

    x1 = x  + attention(attn_norm(x))        # the residual stream x is never normalised itself
    y  = x1 + mlp(ffn_norm(x1))

`reference.decoder_block` is this wiring with SmolLM2's (or the toy's) attention and SwiGLU
inlined; here the sublayers are arguments, so one can test the wiring alone or drive a real
model's sublayers through it (lessons.inside_model.logits_with_block).
"""
from __future__ import annotations


def pre_norm_block(x, attn_norm, attention, ffn_norm, mlp):
    """One pre-norm block: each sublayer reads a normalised copy of the stream and adds its
    output to the stream.  x [S, D] -> [S, D]; the four arguments map [S, D] -> [S, D]."""
    x1 = x + attention(attn_norm(x))
    return x1 + mlp(ffn_norm(x1))
