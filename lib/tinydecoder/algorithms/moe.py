"""A mixture-of-experts feed-forward, from its definition.

    p       = softmax(x W_r)                              # [T, E] router probabilities
    chosen  = the k largest p[t] (ties: lower index)      # [T, k] expert ids per token
    g       = p[t, chosen] / sum_j p[t, chosen_j]         # [T, k] gates, renormalised to sum 1
    y_t     = sum_j g[t, j] * FFN_{chosen[t, j]}(x_t)     # [T, D]
    FFN_e(x) = (SiLU(x Wg_e) * (x Wu_e)) Wd_e             # each expert a small SwiGLU

`moe_reference` computes y token by token, slot by slot, as the sum reads. `moe_grouped` is the
same sum arranged the way engines run it (gather the tokens of each expert, one matmul per
expert, scatter back); tests prove the two equal, and the notebook uses the grouped one for
speed. A capacity factor (Switch Transformer) caps the tokens an expert takes in one batch:
`capacity = ceil(factor * T * k / E)`, and the assignments past it, in token order, are
dropped (the token's residual stream carries on without that expert).

Carving: a dense SwiGLU with F hidden units is a sum over its units, so any partition of the
units into E groups splits it into E experts whose outputs add up to the dense output. With
every expert chosen and unit gates (`gating="unit"`, every chosen expert counted in full) the
MoE *is* the dense FFN, up to the order of float additions.

Load balance: Switch Transformer (Fedus, Zoph and Shazeer, "Switch Transformers: Scaling to
Trillion Parameter Models with Simple and Efficient Sparsity", JMLR 2022, arXiv:2101.03961,
eq. 4) adds alpha * E * sum_i f_i P_i to the loss, f_i the fraction of tokens dispatched to
expert i and P_i the mean router probability of expert i. It is 1 when both are uniform.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.ops import softmax, swiglu
from ..core.validate import is_int, is_real

GATINGS = ("softmax", "unit")


@dataclass(frozen=True)
class Expert:
    """One expert: a SwiGLU with f hidden units.  x [T, D] -> [T, D]."""

    w_gate: np.ndarray  # [D, f]
    w_up: np.ndarray  # [D, f]
    w_down: np.ndarray  # [f, D]

    def __call__(self, x) -> np.ndarray:
        return swiglu(x, self.w_gate, self.w_up) @ self.w_down

    @property
    def n_units(self) -> int:
        return self.w_down.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes of weights one token reads when it visits this expert."""
        return self.w_gate.nbytes + self.w_up.nbytes + self.w_down.nbytes


# ----------------------------------------------------------------------------- checks

def check_n_experts(n_experts, n_units: int | None = None) -> int:
    if not is_int(n_experts):
        raise TypeError(f"n_experts must be an int, got {type(n_experts).__name__}")
    if n_experts < 1:
        raise ValueError(f"n_experts must be >= 1, got {n_experts}")
    if n_units is not None and n_experts > n_units:
        raise ValueError(f"n_experts={n_experts} is more than the {n_units} hidden units to share out")
    return int(n_experts)


def check_k(k, n_experts: int) -> int:
    if not is_int(k):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= n_experts:
        raise ValueError(f"k (experts per token) must be in 1..{n_experts}, got {k}")
    return int(k)


def check_partition(labels, n_units: int, n_experts: int) -> np.ndarray:
    """labels [F]: the expert (0..E-1) of each hidden unit; every expert gets at least one unit."""
    n_experts = check_n_experts(n_experts, n_units)
    labels = np.asarray(labels)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"a partition gives each hidden unit an integer expert id, got dtype {labels.dtype}")
    if labels.shape != (n_units,):
        raise ValueError(f"a partition needs one expert id per hidden unit, shape ({n_units},), got {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= n_experts):
        raise ValueError(f"expert ids must be in 0..{n_experts - 1}, got {labels.min()}..{labels.max()}")
    sizes = np.bincount(labels, minlength=n_experts)
    if (sizes == 0).any():
        raise ValueError(f"experts {np.flatnonzero(sizes == 0).tolist()} get no hidden units")
    return labels.astype(np.int64)


# ----------------------------------------------------------------------------- carving

def contiguous_partition(n_units: int, n_experts: int) -> np.ndarray:
    """Units 0..F/E-1 to expert 0, the next F/E to expert 1, ...  -> labels [F]."""
    n_experts = check_n_experts(n_experts, n_units)
    if n_units % n_experts:
        raise ValueError(f"{n_units} hidden units do not split into {n_experts} equal experts "
                         f"(use a divisor of {n_units})")
    return np.arange(n_units) // (n_units // n_experts)


def carve_experts(w_gate, w_up, w_down, labels, n_experts: int) -> list:
    """Split a dense SwiGLU (w_gate, w_up [D, F], w_down [F, D]) into experts by `labels` [F].

    Expert e gets the columns of w_gate and w_up and the rows of w_down of its units. When the
    labels are already sorted the experts are views of the dense weights; otherwise the units
    are reordered once (one copy of the FFN) and the experts are views of that copy."""
    F = np.shape(w_down)[0]
    if np.shape(w_gate) != np.shape(w_up) or np.shape(w_gate)[1] != F:
        raise ValueError(f"w_gate {np.shape(w_gate)}, w_up {np.shape(w_up)} must be [D, F] and w_down "
                         f"{np.shape(w_down)} [F, D]")
    labels = check_partition(labels, F, n_experts)
    if (np.diff(labels) < 0).any():
        order = np.argsort(labels, kind="stable")
        w_gate, w_up, w_down, labels = w_gate[:, order], w_up[:, order], w_down[order], labels[order]
    ends = np.cumsum(np.bincount(labels, minlength=n_experts))
    starts = np.r_[0, ends[:-1]]
    return [Expert(w_gate[:, a:b], w_up[:, a:b], w_down[a:b]) for a, b in zip(starts, ends)]


# ----------------------------------------------------------------------------- routing

def top_k_gating(router_logits, k: int, gating: str = "softmax"):
    """-> experts [T, k] (largest probability first, ties to the lower id), gates [T, k].

    gating="softmax": softmax over all E experts, keep the top k, renormalise them to sum 1.
    gating="unit": the same experts, every gate 1 (the carved pieces of one dense FFN)."""
    logits = np.asarray(router_logits)
    if logits.ndim != 2:
        raise ValueError(f"router_logits must be [T, E], got shape {logits.shape}")
    if gating not in GATINGS:
        raise ValueError(f"gating must be one of {GATINGS}, got {gating!r}")
    k = check_k(k, logits.shape[1])
    probs = softmax(logits.astype(np.float64 if logits.dtype == np.float64 else np.float32), axis=-1)  # [T, E]
    experts = np.argsort(-probs, axis=1, kind="stable")[:, :k]  # [T, k]
    if gating == "unit":
        return experts, np.ones(experts.shape, probs.dtype)
    top = np.take_along_axis(probs, experts, axis=1)  # [T, k]
    return experts, top / top.sum(axis=1, keepdims=True)


def expert_capacity(n_tokens: int, k: int, n_experts: int, capacity_factor: float) -> int:
    """ceil(factor * T * k / E): the assignments one expert takes per batch."""
    if not is_real(capacity_factor):
        raise TypeError(f"capacity_factor must be a number, got {type(capacity_factor).__name__}")
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor}")
    return math.ceil(capacity_factor * n_tokens * k / n_experts)


def dispatch_mask(experts, n_experts: int, capacity: int | None) -> np.ndarray:
    """keep [T, k]: True where assignment (t, j) fits in its expert's capacity. Assignments are
    served in token order (then slot order); None means no cap."""
    experts = np.asarray(experts)
    if capacity is None:
        return np.ones(experts.shape, bool)
    flat = experts.reshape(-1)  # row-major: token 0's slots, token 1's, ...
    onehot = flat[:, None] == np.arange(n_experts)[None, :]  # [T*k, E]
    seat = np.cumsum(onehot, axis=0)[np.arange(flat.size), flat]  # 1-based place in its expert's queue
    return (seat <= capacity).reshape(experts.shape)


def tokens_per_expert(experts, n_experts: int, keep=None) -> np.ndarray:
    """counts [E]: how many (kept) assignments each expert got."""
    experts = np.asarray(experts)
    chosen = experts if keep is None else experts[np.asarray(keep, bool)]
    return np.bincount(chosen.reshape(-1), minlength=n_experts)


def load_balancing_loss(router_probs, experts) -> float:
    """Switch Transformer's auxiliary loss (without alpha): E * sum_i f_i * P_i.

    f_i: the fraction of the T*k assignments that go to expert i (Switch has k = 1);
    P_i: the mean over tokens of the router probability of expert i. 1.0 when balanced."""
    probs = np.asarray(router_probs, np.float64)
    if probs.ndim != 2:
        raise ValueError(f"router_probs must be [T, E], got shape {probs.shape}")
    T, E = probs.shape
    experts = np.asarray(experts)
    if experts.ndim != 2 or experts.shape[0] != T:
        raise ValueError(f"experts must be [T={T}, k], got shape {experts.shape}")
    f = tokens_per_expert(experts, E) / experts.size  # [E]
    P = probs.mean(axis=0)  # [E]
    return float(E * np.sum(f * P))


# ----------------------------------------------------------------------------- the layer

def moe_reference(x, experts: list, chosen, gates) -> np.ndarray:
    """y_t = sum_j gates[t, j] * FFN_{chosen[t, j]}(x_t), one token and one slot at a time.
    A negative id in `chosen` is a dropped assignment (skipped)."""
    x = np.asarray(x)
    y = np.zeros(x.shape, x.dtype)  # [T, D]
    for t in range(x.shape[0]):
        for j in range(chosen.shape[1]):
            e = chosen[t, j]
            if e >= 0:
                y[t] += gates[t, j] * experts[e](x[t:t + 1])[0]
    return y


def moe_grouped(x, experts: list, chosen, gates) -> np.ndarray:
    """moe_reference's sum, one matmul per expert: gather its tokens, run it, scatter back."""
    x = np.asarray(x)
    y = np.zeros(x.shape, x.dtype)  # [T, D]
    for e, expert in enumerate(experts):
        rows, slots = np.nonzero(chosen == e)  # a token picks an expert at most once: rows unique
        if rows.size:
            y[rows] += gates[rows, slots, None].astype(x.dtype) * expert(x[rows])
    return y


@dataclass
class MoEOutput:
    y: np.ndarray  # [T, D]
    probs: np.ndarray  # [T, E] router probabilities
    experts: np.ndarray  # [T, k] chosen experts, before any drop
    gates: np.ndarray  # [T, k]
    keep: np.ndarray  # [T, k] False where the capacity dropped the assignment

    @property
    def n_dropped(self) -> int:
        return int((~self.keep).sum())


@dataclass
class MoELayer:
    """A router (logits = x W_r + b_r) and E experts; `k` experts per token; `gating` softmax
    (renormalised) or unit; an optional capacity factor."""

    w_router: np.ndarray  # [D, E]
    experts: list
    k: int = 2
    gating: str = "softmax"
    capacity_factor: float | None = None
    b_router: np.ndarray | None = None  # [E]

    def __post_init__(self):
        E = len(self.experts)
        if np.ndim(self.w_router) != 2 or np.shape(self.w_router)[1] != E:
            raise ValueError(f"w_router must be [D, E={E}], got shape {np.shape(self.w_router)}")
        self.k = check_k(self.k, E)
        if self.gating not in GATINGS:
            raise ValueError(f"gating must be one of {GATINGS}, got {self.gating!r}")

    @property
    def n_experts(self) -> int:
        return len(self.experts)

    def route(self, x) -> MoEOutput:
        """Everything but the experts' outputs (y left as zeros)."""
        logits = np.asarray(x) @ self.w_router  # [T, E]
        if self.b_router is not None:
            logits = logits + self.b_router
        experts, gates = top_k_gating(logits, self.k, self.gating)
        cap = None if self.capacity_factor is None else expert_capacity(len(logits), self.k, self.n_experts,
                                                                        self.capacity_factor)
        keep = dispatch_mask(experts, self.n_experts, cap)
        return MoEOutput(np.zeros(np.shape(x), np.asarray(x).dtype), softmax(logits, axis=-1), experts, gates, keep)

    def __call__(self, x, reference: bool = False) -> MoEOutput:
        out = self.route(x)
        chosen = np.where(out.keep, out.experts, -1)
        out.y = (moe_reference if reference else moe_grouped)(x, self.experts, chosen, out.gates)
        return out

    def bytes_per_token(self) -> int:
        """Weights one decode token reads: the router and its k experts (the largest k, so an
        upper bound when experts differ in size; exact for equal experts)."""
        sizes = sorted((e.nbytes for e in self.experts), reverse=True)
        router = np.asarray(self.w_router).nbytes + (0 if self.b_router is None else np.asarray(self.b_router).nbytes)
        return int(router + sum(sizes[:self.k]))


def moe_forward(x, router_logits, experts: list, k: int) -> np.ndarray:
    """The layer's output: route (softmax over the E experts), keep the top k, renormalise their
    gates, and sum the chosen experts' outputs weighted by the gates, back in the tokens' rows.
    x [T, D], router_logits [T, E], experts: E functions [n, D] -> [n, D].  -> [T, D]"""
    chosen, gates = top_k_gating(router_logits, k)
    return moe_grouped(x, experts, chosen, gates)
