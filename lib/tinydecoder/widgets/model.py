"""Widgets of Part I's first chapters: embeddings, one query, one layer, KV heads, prefill vs decode."""

from __future__ import annotations

import math

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from .. import viz
from ..core.ops import attention
from ..core.reference import LAYER_STEPS, decoder_block, layer_input  # noqa: F401 (notebooks use widgets.layer_input)
from ..core.validate import check_token_ids, layer_index
from .base import STYLE, panel, show  # noqa: F401

# ----------------------------------------------------------------------------- 01: embeddings

def embedding_parts(model, token_id, position):
    """The token's embedding row, the position's row of the position table, and their sum:
    the input vector of that token at that position.  -> {"token", "position", "sum"}: [D] each."""
    cfg = model.config
    token_id = int(check_token_ids(cfg, [token_id])[0])
    if model.pos_table is None:
        raise ValueError(f"model {cfg.name!r} has no position table (position={cfg.position!r}); "
                         f"its positions enter inside attention, not at the embedding")
    if not 0 <= int(position) < cfg.max_context:
        raise ValueError(f"position {position} is out of range: 0..{cfg.max_context - 1} (max_context)")
    tok = model.embed[token_id]  # [D]
    pos = model.pos_table[int(position)]  # [D]
    return {"token": tok, "position": pos, "sum": tok + pos}


def embedding_figure(parts, token_id, position):
    """Bars of the three vectors, and the same three as rows of a heatmap."""
    fig, (ax_bar, ax_map) = plt.subplots(1, 2, figsize=(11, 3.2), layout="constrained",
                                         width_ratios=[1.3, 1])
    viz.vector_bars(ax_bar, {f"embed[{token_id}]": parts["token"], f"pos_table[{position}]": parts["position"],
                             "sum": parts["sum"]}, "token vector + position vector = input row")
    viz.heatmap(ax_map, np.stack([parts["token"], parts["position"], parts["sum"]]),
                ["token", "position", "sum"], None, f"token id {token_id} at position {position}",
                cmap="RdBu_r", symmetric=True, annotate=True, fmt="{:.2f}", xlabel="dimension", ylabel="")
    return fig


def embedding_widget(model, names=None, max_position=15):
    """Dropdown "token id" and slider "position": see the two vectors and their sum."""
    cfg = model.config
    options = [(f"{t}" if names is None else f"{t}: {names[t]}", t) for t in range(cfg.vocab_size)]
    token = W.Dropdown(options=options, value=0, description="token id", style=STYLE)
    position = W.IntSlider(value=0, min=0, max=min(max_position, cfg.max_context - 1),
                           description="position", continuous_update=False, style=STYLE)

    def compute(token_id, position):
        return dict(embedding_parts(model, token_id, position), token_id=token_id, position_index=position)

    return panel({"token_id": token, "position": position}, compute,
                 lambda d: embedding_figure(d, d["token_id"], d["position_index"]))
# ----------------------------------------------------------------------------- 02: one query

SEED_KEYS = np.array([[1.0, 0.0], [0.0, 1.0]])  # k0, k1 of the seed's 2-D example
SEED_VALUES = np.array([[10.0, 0.0], [0.0, 20.0]])  # v0, v1


def query_attention(angle, length=1.0, n_visible=None, keys=SEED_KEYS, values=SEED_VALUES):
    """One query q = length·(cos angle, sin angle) (angle in degrees) attending causally to the
    first n_visible keys (default all): the query sits at position n_visible - 1.

    Returns {"q" [d], "scores" [T] (q·k/√d; -inf for unseen keys), "weights" [T], "output" [d]}.
    The weights and output come from ops.attention."""
    keys, values = np.asarray(keys, dtype=np.float64), np.asarray(values, dtype=np.float64)
    T, d = keys.shape
    n_visible = T if n_visible is None else int(n_visible)
    if not 1 <= n_visible <= T:
        raise ValueError(f"n_visible must be in 1..{T} (the number of keys), got {n_visible}")
    if length < 0:
        raise ValueError(f"query length must be >= 0, got {length}")
    a = math.radians(angle)
    q = np.zeros(d)
    q[:2] = length * math.cos(a), length * math.sin(a)
    scores = np.full(T, -np.inf)
    scores[:n_visible] = keys[:n_visible] @ q / math.sqrt(d)
    out, w = attention(q[None, None, :], keys[:n_visible, None, :], values[:n_visible, None, :],
                       return_weights=True)  # [1, d], [1, 1, n_visible]
    weights = np.zeros(T)
    weights[:n_visible] = w[0, 0]
    return {"q": q, "scores": scores, "weights": weights, "output": out[0]}


def query_figure(data, keys=SEED_KEYS, values=SEED_VALUES):
    T = len(keys)
    fig, axes = plt.subplots(1, 3, figsize=(11.5, 3.4), layout="constrained", width_ratios=[1, 1.2, 1])
    viz.arrows_2d(axes[0], {"q": data["q"], **{f"k{j}": keys[j] for j in range(T)}},
                  "query and keys", limit=3.2)
    viz.heatmap(axes[1], data["weights"][None, :], ["q"], [f"k{j}" for j in range(T)],
                "weights = softmax(q·k/√d)", mask=~np.isfinite(data["scores"])[None, :], vmin=0, vmax=1,
                annotate=True, fmt="{:.4f}", ylabel="", cbar_label="weight")
    o = data["output"]
    viz.arrows_2d(axes[2], {**{f"v{j}": values[j] for j in range(T)}, "out": o},
                  f"output = Σ w·v = ({o[0]:.3f}, {o[1]:.3f})", limit=24)
    return fig


def query_widget(keys=SEED_KEYS, values=SEED_VALUES):
    """Sliders "query angle (°)", "query length" and a dropdown for the query's position."""
    T = len(keys)
    angle = W.FloatSlider(value=0.0, min=-180.0, max=180.0, step=5.0, description="query angle (°)",
                          continuous_update=False, style=STYLE)
    length = W.FloatSlider(value=1.0, min=0.0, max=3.0, step=0.1, description="query length",
                           continuous_update=False, style=STYLE)
    options = [(f"position {n - 1} (sees k0" + (f"..k{n - 1})" if n > 1 else " only)"), n) for n in range(T, 0, -1)]
    visible = W.Dropdown(options=options,
                         value=T, description="query at", style=STYLE)
    return panel({"angle": angle, "length": length, "n_visible": visible},
                 lambda angle, length, n_visible: query_attention(angle, length, n_visible, keys, values),
                 lambda d: query_figure(d, keys, values))
# ----------------------------------------------------------------------------- 03: one layer

def layer_steps(model, token_ids, layer):
    """Every intermediate tensor of one pre-norm block on a prefill, as the reference
    `decoder_block` computes it: {name: array [S, width]} for the names in LAYER_STEPS, plus
    "weights" [Hq, S, S]. "residual 2" is the block's output."""
    layer = layer_index(layer, model.config.n_layers)
    x = layer_input(model, token_ids, layer)  # [S, D]
    steps = {}
    decoder_block(model.layers[layer], x, np.arange(len(x)), model.new_cache(len(x)).layer(layer), record=steps)
    return {name: steps[name] for name in LAYER_STEPS + ("weights",)}


def layer_tensor_figure(name, tensor, layer, token_ids):
    S, width = tensor.shape
    fig, ax = plt.subplots(figsize=(min(2.5 + 0.45 * width, 12), 0.6 + 0.45 * S + 1.2), layout="constrained")
    viz.heatmap(ax, tensor, viz.token_labels(token_ids), None,
                f"layer {layer}: {name}  {viz.fmt_shape(tensor.shape)}", cmap="RdBu_r", symmetric=True,
                annotate=width <= 16 and S <= 8, fmt="{:.2f}", xlabel="feature", ylabel="position:token")
    return fig


def layer_widget(model, token_ids):
    """Dropdowns "layer" and "tensor": the heatmap and shape of any intermediate of a block."""
    cfg = model.config
    ids = [int(t) for t in check_token_ids(cfg, token_ids)]
    layer = W.Dropdown(options=list(range(cfg.n_layers)), value=0, description="layer", style=STYLE)
    tensor = W.Dropdown(options=list(LAYER_STEPS), value="q_proj", description="tensor", style=STYLE)

    def compute(layer, name):
        return {"layer": layer, "name": name, "tensor": layer_steps(model, ids, layer)[name]}

    return panel({"layer": layer, "name": tensor}, compute,
                 lambda d: layer_tensor_figure(d["name"], d["tensor"], d["layer"], ids))
# ----------------------------------------------------------------------------- 05: KV heads

def kv_heads_view(config, n_kv_heads, itemsize=4):
    """What `config`'s query heads look like with `n_kv_heads` KV heads (a divisor of Hq):
    {"mapping" [Hq] (the KV head of each query head), "kind" (MHA/GQA/MQA), "group",
     "bytes_per_token", "mha_bytes_per_token", "saved_bytes_per_token", "saved_fraction",
     "table" (heads.kv_cache_table rows for every divisor)}."""
    from ..lessons import heads  # local: heads is only needed by the notebook-04 widget

    mapping = heads.kv_head_map(config.n_heads, n_kv_heads)
    chosen = heads.with_kv_heads(config, n_kv_heads).kv_bytes_per_token(itemsize)
    mha = heads.with_kv_heads(config, config.n_heads).kv_bytes_per_token(itemsize)
    return {"name": config.name, "n_heads": config.n_heads, "n_kv_heads": int(n_kv_heads),
            "mapping": mapping, "kind": heads.attention_kind(config.n_heads, n_kv_heads),
            "group": config.n_heads // int(n_kv_heads), "bytes_per_token": chosen,
            "mha_bytes_per_token": mha, "saved_bytes_per_token": mha - chosen,
            "saved_fraction": 1 - chosen / mha, "table": heads.kv_cache_table(config, itemsize)}


def kv_heads_figure(data):
    """The head mapping (left) and KV-cache bytes per token for every choice (right)."""
    fig, (ax_map, ax_bar) = plt.subplots(1, 2, figsize=(12, 3.3), layout="constrained", width_ratios=[1.7, 1])
    viz.head_mapping(ax_map, data["n_heads"], data["n_kv_heads"],
                     f"{data['kind']}: {data['n_heads']} query heads share {data['n_kv_heads']} KV head(s), "
                     f"{data['group']} per group")
    rows = data["table"]
    labels = [f"{r['kind']}\nHkv={r['n_kv_heads']}" for r in rows]
    per_token = [r["bytes_per_token"] for r in rows]  # bytes, as the labels on the bars
    colors = ["C1" if r["n_kv_heads"] == data["n_kv_heads"] else "#bbbbbb" for r in rows]
    bars = ax_bar.bar(range(len(rows)), per_token, color=colors, edgecolor="black")
    for b, r in zip(bars, rows):
        ax_bar.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{r['bytes_per_token']:,}",
                    ha="center", va="bottom", fontsize=8)
    ax_bar.set_xticks(range(len(rows)), labels=labels, fontsize=8)
    ax_bar.set_ylabel("KV cache, bytes per token")
    ax_bar.yaxis.set_major_formatter("{x:,.0f}")  # 46,080 as on the bar labels
    ax_bar.set_ylim(0, max(per_token) * 1.2)
    ax_bar.set_title(f"{data['name']}: {data['bytes_per_token']:,} B/token, "
                     f"saves {data['saved_bytes_per_token']:,} B ({data['saved_fraction']:.0%}) vs MHA",
                     fontsize=9)
    return fig


def kv_heads_widget(config, itemsize=4):
    """Slider "KV heads" over the divisors of config.n_heads (starting at the config's own):
    redraws the head mapping and the bytes per token saved against MHA."""
    from ..lessons.heads import divisors

    slider = W.SelectionSlider(options=divisors(config.n_heads), value=config.n_kv_heads,
                               description="KV heads", continuous_update=False, style=STYLE)
    return panel({"n_kv_heads": slider}, lambda n_kv_heads: kv_heads_view(config, n_kv_heads, itemsize),
                 kv_heads_figure)
# ----------------------------------------------------------------------------- 06: prefill vs decode

def phase_view(model, tokens, prompt_length, layer=0, batch=1):
    """Prefill the first `prompt_length` tokens, then one decode step with the greedy token.

    Returns {"prompt" [S ids], "next_token", "prefill_weights" [Hq, S, S], "decode_weights"
    [Hq, 1, S+1] (layer `layer`), "prefill_shapes" / "decode_shapes" (phases.phase_shapes),
    "prefill_flops" / "decode_flops" (attention FLOPs of that layer, from the trace)}."""
    from ..lessons import phases

    S = int(prompt_length)
    if not 1 <= S <= len(tokens):
        raise ValueError(f"prompt_length must be in 1..{len(tokens)} (the tokens given), got {prompt_length}")
    if not 0 <= int(layer) < model.config.n_layers:
        raise ValueError(f"layer must be in 0..{model.config.n_layers - 1}, got {layer}")
    prompt = [int(t) for t in tokens[:S]]
    pre, dec, token = phases.prefill_then_decode(model, prompt, batch=batch)
    return {"prompt": prompt, "next_token": token, "layer": int(layer),
            "prefill_weights": pre.attention_weights[(layer, 0)],
            "decode_weights": dec.attention_weights[(layer, 0)],
            "prefill_shapes": phases.phase_shapes(pre, layer), "decode_shapes": phases.phase_shapes(dec, layer),
            "prefill_flops": pre.total_flops(op="attention", layer=layer),
            "decode_flops": dec.total_flops(op="attention", layer=layer)}


def phase_figure(data, head=0):
    """Prefill's [S, S] weights (the causal triangle) next to the decode step's [1, T] row."""
    S = len(data["prompt"])
    labels = viz.token_labels(data["prompt"])
    labels_t = labels + viz.token_labels([data["next_token"]], start=S)
    fig, (ax_p, ax_d) = plt.subplots(2, 1, figsize=(2.5 + 0.75 * (S + 1), 3.4 + 0.45 * S), layout="constrained",
                                     height_ratios=[S + 1.5, 2.5])
    ps, ds = data["prefill_shapes"]["scores"], data["decode_shapes"]["scores"]
    viz.heatmap(ax_p, data["prefill_weights"][head], labels, labels,
                f"prefill, layer {data['layer']} head {head}: scores {viz.fmt_shape(ps)}\n"
                f"attention FLOPs {data['prefill_flops']:,}", mask="causal", vmin=0, vmax=1,
                annotate=S <= 8, cbar_label="weight", xlabel="key position:token", ylabel="query position:token")
    viz.heatmap(ax_d, data["decode_weights"][head], labels_t[-1:], labels_t,
                f"decode step: scores {viz.fmt_shape(ds)}\nattention FLOPs {data['decode_flops']:,}",
                mask="causal", vmin=0, vmax=1, annotate=S <= 8, cbar_label="weight",
                xlabel="key position:token (S cached + 1 new)", ylabel="new query")
    ax_p.set_xlim(-0.5, S + 0.5)  # the same columns as the decode row: one more key there
    return fig


def phase_widget(model, tokens, layer=0, head=0):
    """Slider "prompt length S": the prefill triangle [S, S] and the next decode row [1, S+1]."""
    length = W.IntSlider(value=min(4, len(tokens)), min=1, max=len(tokens), description="prompt length S",
                         continuous_update=False, style=STYLE)
    return panel({"prompt_length": length}, lambda prompt_length: phase_view(model, tokens, prompt_length, layer),
                 lambda d: phase_figure(d, head))
