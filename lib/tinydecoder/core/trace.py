"""An opt-in recorder of what a forward pass did: op shapes, FLOPs and attention weights.

Pass `trace=Trace()` to `forward`; without it nothing is recorded and nothing is slowed."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OpRecord:
    layer: int | None  # None for ops outside the blocks (embedding, final norm, LM head)
    op: str  # e.g. "q_proj", "attention", "ffn_down"
    inputs: tuple  # input shapes, e.g. ((4, 8), (8, 8))
    output: tuple  # output shape
    flops: int  # multiply-adds count twice; elementwise ops count 0 here
    segment: int = 0  # which sequence of a batch (attention only)


@dataclass
class Trace:
    ops: list = field(default_factory=list)
    attention_weights: dict = field(default_factory=dict)  # (layer, segment) -> [Hq, S, T]
    keep_weights: bool = True

    def record(self, layer, op, inputs, output, flops=0, segment=0):
        self.ops.append(OpRecord(layer, op, tuple(tuple(s) for s in inputs), tuple(output),
                                 int(flops), segment))

    def matmul(self, layer, op, a_shape, b_shape):
        """Record x[M, K] @ w[K, N]: 2*M*K*N FLOPs."""
        m, k = a_shape
        k2, n = b_shape
        self.record(layer, op, (a_shape, b_shape), (m, n), 2 * m * k * n)

    def total_flops(self, op=None, layer=None) -> int:
        return sum(r.flops for r in self.ops
                   if (op is None or r.op == op) and (layer is None or r.layer == layer))

    def select(self, op=None, layer=None):
        return [r for r in self.ops if (op is None or r.op == op) and (layer is None or r.layer == layer)]

    def table(self, layer=0):
        """Rows (op, input shapes, output shape, FLOPs) for the ops of one layer plus the
        ops outside the blocks, in execution order: the shape table of notebook 03."""
        return [(r.op, r.inputs, r.output, r.flops) for r in self.ops
                if r.layer is None or r.layer == layer]
