"""MoEfication on SmolLM2: a dense model's feed-forward layers turned into mixtures of experts.

After Zhang, Lin, Liu, Li, Sun and Zhou, "MoEfication: Transformer Feed-forward Layers are
Mixtures of Experts" (Findings of ACL 2022, arXiv:2110.01786):

1. calibrate: run the dense model on some text and keep each layer's FFN input z [T, D];
2. cluster each layer's F hidden units into E experts of F/E units by co-activation: a unit's
   profile is |h_i(t)| over the calibration tokens (h = SiLU(z Wg) * (z Wu)), normalised; units
   whose profiles point the same way fire together. Balanced k-means (numpy, seeded);
3. carve the layer into those experts (`algorithms.moe.carve_experts`);
4. train a router per layer by least squares: logits = z W + b fitted to log ||FFN_e(z_t)||
   (centred per token), so softmax(logits) predicts each expert's share of the output norm;
5. run the model with k experts per token and unit gates (each chosen piece counted in full, so
   k = E is the dense model again), choosing them by the learned router or by an oracle that
   computes every expert and keeps the k with the largest output norm.

Everything goes through the reference forward pass, its `ffn` parameter replacing each layer's
dense feed-forward: nothing is patched.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..algorithms.moe import MoELayer, carve_experts, check_k, check_n_experts, moe_grouped, top_k_gating
from ..core.ops import swiglu
from ..core.reference import forward
from ..core.validate import check_token_ids

ROUTERS = ("learned", "oracle")


def calibration_inputs(model, sequences) -> list:
    """Each layer's FFN input z for every token of every sequence, dense model.  -> [L] x [T, D]."""
    if isinstance(sequences, np.ndarray) or (len(sequences) and np.isscalar(sequences[0])):
        raise TypeError("sequences must be a list of token-id lists (one per text)")
    rows = [[] for _ in model.layers]

    def dense_and_keep(l, layer, z):
        rows[l].append(np.array(z))
        return swiglu(z, layer.w_gate, layer.w_up) @ layer.w_down

    for ids in sequences:
        forward(model, check_token_ids(model.config, ids), ffn=dense_and_keep)
    return [np.concatenate(r) for r in rows]


def hidden_units(layer, z) -> np.ndarray:
    """h = SiLU(z Wg) * (z Wu), the dense FFN's hidden activations.  -> [T, F]"""
    return swiglu(z, layer.w_gate, layer.w_up)


def coactivation_profiles(h) -> np.ndarray:
    """[F, T]: each hidden unit's |activation| over the tokens (h [T, F]), scaled to unit length."""
    prof = np.abs(h).T  # [F, T]
    return prof / np.maximum(np.linalg.norm(prof, axis=1, keepdims=True), 1e-12)


def balanced_assign(dist) -> np.ndarray:
    """labels [F] with exactly F/E units per cluster: units, most certain first (smallest
    distance to their nearest centre), each take their nearest centre that still has room."""
    F, E = dist.shape
    room = np.full(E, F // E)
    prefs = np.argsort(dist, axis=1, kind="stable")  # [F, E] centres, nearest first
    labels = np.empty(F, np.int64)
    for u in np.argsort(dist.min(axis=1), kind="stable"):
        c = next(c for c in prefs[u] if room[c])
        labels[u] = c
        room[c] -= 1
    return labels


def balanced_kmeans(points, n_clusters: int, seed: int = 0, iters: int = 10) -> np.ndarray:
    """Cluster the rows of points [F, n] into n_clusters groups of exactly F/n_clusters rows
    (squared Euclidean distance, centres = means).  -> labels [F]."""
    points = np.asarray(points, np.float32)
    F = len(points)
    n_clusters = check_n_experts(n_clusters, F)
    if F % n_clusters:
        raise ValueError(f"{F} units do not split into {n_clusters} clusters of equal size")
    rng = np.random.default_rng(seed)
    centres = points[rng.choice(F, n_clusters, replace=False)]  # [E, n]
    labels, sq = None, (points ** 2).sum(1)[:, None]  # [F, 1]
    for _ in range(iters):
        dist = sq - 2 * points @ centres.T + (centres ** 2).sum(1)[None, :]  # [F, E] squared distances
        new = balanced_assign(dist)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        onehot = (labels[:, None] == np.arange(n_clusters)[None, :]).astype(np.float32)  # [F, E]
        centres = (onehot.T @ points) / onehot.sum(axis=0)[:, None]  # each cluster's mean
    return labels


def expert_norms(h, labels, w_down, n_experts: int) -> np.ndarray:
    """[T, E]: ||FFN_e(z_t)||, each expert's output norm per token, from the dense hidden
    activations h [T, F]: expert e's output is h[:, its units] @ w_down[its units]."""
    return np.stack([np.linalg.norm(h[:, labels == e] @ w_down[labels == e], axis=1)
                     for e in range(n_experts)], axis=1)


def fit_router(z, norms, ridge: float = 1e-2):
    """Least squares (ridge) for logits = z W + b ~ log norms, centred per token.
    -> W [D, E], b [E] (float32)."""
    z = np.asarray(z, np.float64)
    target = np.log(np.maximum(np.asarray(norms, np.float64), 1e-12))
    target -= target.mean(axis=1, keepdims=True)  # softmax ignores a per-token constant
    X = np.concatenate([z, np.ones((len(z), 1))], axis=1)  # [T, D + 1]
    gram = X.T @ X
    gram[np.diag_indices_from(gram)] += ridge * np.trace(gram) / len(gram)
    coef = np.linalg.solve(gram, X.T @ target)  # [D + 1, E]
    return coef[:-1].astype(np.float32), coef[-1].astype(np.float32)


def top_k_overlap(scores_a, scores_b, k: int) -> float:
    """Mean over tokens of |top-k(a) & top-k(b)| / k."""
    a = np.argsort(-scores_a, axis=1, kind="stable")[:, :k]
    b = np.argsort(-scores_b, axis=1, kind="stable")[:, :k]
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))


@dataclass
class MoEfied:
    """A dense model's FFNs as experts: per layer the partition, the experts and the router."""

    n_experts: int
    labels: list  # [L] x [F] expert of each hidden unit
    experts: list  # [L] x [E] Expert
    routers: list  # [L] x (W [D, E], b [E])
    routing: dict = field(default_factory=dict)  # filled by runs that record: layer -> [T, k] experts

    def layer(self, l: int, k: int) -> MoELayer:
        """Layer l as an `algorithms.moe.MoELayer` (learned router, unit gates)."""
        W, b = self.routers[l]
        return MoELayer(W, self.experts[l], k=k, gating="unit", b_router=b)

    def ffn(self, k: int, router: str = "learned", record: bool = False):
        """An `ffn(l, layer, z)` for the reference forward: k of the E experts per token."""
        k = check_k(k, self.n_experts)
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
        self.routing = {}

        def moe_ffn(l, layer, z):
            experts = self.experts[l]
            if router == "oracle":
                outs = np.stack([e(z) for e in experts])  # [E, T, D]: every expert, to rank them
                chosen, _ = top_k_gating(np.log(np.maximum(np.linalg.norm(outs, axis=2).T, 1e-30)), k, "unit")
                y = np.take_along_axis(outs, chosen.T[:, :, None], axis=0).sum(axis=0)
            else:
                W, b = self.routers[l]
                chosen, gates = top_k_gating(z @ W + b, k, "unit")
                y = moe_grouped(z, experts, chosen, gates)
            if record:
                self.routing[l] = chosen
            return y.astype(z.dtype)

        return moe_ffn


def moefy(model, calibration, n_experts: int = 16, seed: int = 0, iters: int = 10, ridge: float = 1e-2) -> MoEfied:
    """Cluster, carve and fit routers for every layer from calibration inputs (calibration_inputs)."""
    F = model.config.d_ff
    n_experts = check_n_experts(n_experts, F)
    if len(calibration) != len(model.layers):
        raise ValueError(f"need one calibration array per layer ({len(model.layers)}), got {len(calibration)}")
    labels, experts, routers = [], [], []
    for layer, z in zip(model.layers, calibration):
        h = hidden_units(layer, z)  # [T, F]
        lab = balanced_kmeans(coactivation_profiles(h), n_experts, seed=seed, iters=iters)
        labels.append(lab)
        experts.append(carve_experts(layer.w_gate, layer.w_up, layer.w_down, lab, n_experts))
        routers.append(fit_router(z, expert_norms(h, lab, layer.w_down, n_experts), ridge))
    return MoEfied(n_experts, labels, experts, routers)


def perplexity(model, token_ids, ffn=None) -> float:
    """exp(mean NLL) of token_ids[1:] given what comes before, one reference forward pass."""
    ids = check_token_ids(model.config, token_ids)
    if len(ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, got {len(ids)}")
    logits = forward(model, ids[:-1], ffn=ffn).astype(np.float64)  # [T-1, V]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted[np.arange(len(ids) - 1), ids[1:]] - np.log(np.exp(shifted).sum(axis=1))
    return float(np.exp(-log_probs.mean()))


# ----------------------------------------------------------------------------- serving costs

def dense_ffn_bytes(model) -> int:
    """Bytes of FFN weights one decode token reads in the dense model (every layer's gate, up, down)."""
    return sum(layer.w_gate_up.nbytes + layer.w_down.nbytes for layer in model.layers)


def moe_ffn_bytes(moefied: MoEfied, k: int) -> int:
    """Bytes of FFN weights one decode token reads with k experts: each layer's router and its k experts."""
    return sum(moefied.layer(l, k).bytes_per_token() for l in range(len(moefied.experts)))


def decode_ffn_seconds(model, moefied: MoEfied, z_rows, k: int | None, repeats: int = 5) -> float:
    """Fastest of `repeats` runs of one decode token's FFNs through every layer (z_rows: one
    [1, D] input per layer): the dense FFN when k is None, else the learned router and k experts."""
    import time

    if len(z_rows) != len(model.layers):
        raise ValueError(f"need one [1, D] input per layer ({len(model.layers)}), got {len(z_rows)}")
    ffn = None if k is None else moefied.ffn(k)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for l, (layer, z) in enumerate(zip(model.layers, z_rows)):
            swiglu(z, layer.w_gate, layer.w_up) @ layer.w_down if ffn is None else ffn(l, layer, z)
        best = min(best, time.perf_counter() - start)
    return best
