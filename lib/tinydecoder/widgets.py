"""Interactive widgets for the notebooks (ipywidgets 8).

The pattern, for every widget:
1. a pure data function, e.g. `query_attention(angle, length)`, returns numbers (dicts of
   arrays) for given slider values — unit tests call it directly, no browser needed;
2. a draw function turns that data into a matplotlib figure (or a Table / text);
3. a builder, e.g. `query_widget()`, makes the sliders/dropdowns (each with a clear
   `description=`) and hands all three to `panel(...)`, which redraws the Output area on every
   change and returns the widget. The returned box keeps `.controls` (name -> widget),
   `.output` (the Output area), `.data` (the latest data) and `.refresh()`, so a test can set
   `box.controls["angle"].value = 90` and check `box.data`.
"""
from __future__ import annotations

import math

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from . import viz
from .model import check_token_ids, layer_input  # noqa: F401 (notebooks use widgets.layer_input)
from .ops import apply_rope, attention, rmsnorm, silu

STYLE = {"description_width": "initial"}  # show the whole description, not a clipped one


# ----------------------------------------------------------------------------- the pattern

def _in_ipython():
    from IPython import get_ipython

    return get_ipython() is not None


def show(obj):
    """Display a figure (then close it, so it is not shown twice), a Table/HTML object, or text
    in the current output. Outside IPython (unit tests) figures are just closed."""
    from IPython.display import display

    if not _in_ipython():
        if isinstance(obj, plt.Figure):
            plt.close(obj)
        return
    if obj is None:
        return
    if isinstance(obj, str):
        print(obj)
    else:
        display(obj)
    if isinstance(obj, plt.Figure):
        plt.close(obj)


def panel(controls, compute, draw, *, title=None):
    """Wire widgets to a pure function and a drawing.

    controls: dict name -> widget (a slider, dropdown, ...); compute(**values) -> data;
    draw(data) -> a Figure, a Table/HTML object or a string, shown in an Output area.
    Draws once now, then on every change of any control. Returns a VBox (see module doc)."""
    controls = dict(controls)
    out = W.Output()
    header = [W.HTML(f"<b>{title}</b>")] if title else []
    box = W.VBox(header + [W.HBox(list(controls.values())), out])

    def refresh(_change=None):
        box.data = compute(**{name: w.value for name, w in controls.items()})
        if _in_ipython():
            out.clear_output(wait=True)
        with out:
            show(draw(box.data))

    for w in controls.values():
        w.observe(refresh, names="value")
    box.controls, box.output, box.refresh = controls, out, refresh
    refresh()
    return box


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
    visible = W.Dropdown(options=[(f"position {n - 1} (sees k0" + (f"..k{n - 1})" if n > 1 else " only)"), n) for n in range(T, 0, -1)],
                         value=T, description="query at", style=STYLE)
    return panel({"angle": angle, "length": length, "n_visible": visible},
                 lambda angle, length, n_visible: query_attention(angle, length, n_visible, keys, values),
                 lambda d: query_figure(d, keys, values))


# ----------------------------------------------------------------------------- 03: one layer

LAYER_STEPS = ("input x", "attn_norm", "q_proj", "k_proj", "v_proj", "attention", "o_proj",
               "residual 1", "ffn_norm", "ffn_gate", "ffn_up", "swiglu", "ffn_down", "residual 2")


def layer_steps(model, token_ids, layer):
    """Every intermediate tensor of one pre-norm block on a prefill, computed op by op:
    {name: array [S, width]} for the names in LAYER_STEPS, plus "weights" [Hq, S, S].
    "residual 2" equals decoder_block's output for that layer."""
    cfg, lw = model.config, model.layers[int(layer)]
    Hq, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    x = layer_input(model, token_ids, layer)  # [S, D]
    S = x.shape[0]
    u = rmsnorm(x, lw.attn_norm, cfg.norm_eps)  # [S, D]
    q, k, v = u @ lw.wq, u @ lw.wk, u @ lw.wv  # [S, Hq*d], [S, Hkv*d], [S, Hkv*d]
    q3, k3, v3 = q.reshape(S, Hq, d), k.reshape(S, Hkv, d), v.reshape(S, Hkv, d)
    if cfg.position == "rope":
        q3 = apply_rope(q3, np.arange(S), cfg.rope_base, cfg.rope_layout)
        k3 = apply_rope(k3, np.arange(S), cfg.rope_base, cfg.rope_layout)
    att, weights = attention(q3, k3, v3, return_weights=True)  # [S, Hq*d], [Hq, S, S]
    o = att @ lw.wo  # [S, D]
    y = x + o
    z = rmsnorm(y, lw.ffn_norm, cfg.norm_eps)
    gate, up = z @ lw.w_gate, z @ lw.w_up  # [S, F]
    hidden = silu(gate) * up  # [S, F]: swiglu(z, w_gate, w_up), from the two products above
    down = hidden @ lw.w_down  # [S, D]
    tensors = (x, u, q, k, v, att, o, y, z, gate, up, hidden, down, y + down)
    return dict(zip(LAYER_STEPS, tensors), weights=weights)


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


# ----------------------------------------------------------------------------- 04: KV heads

def kv_heads_view(config, n_kv_heads, itemsize=4):
    """What `config`'s query heads look like with `n_kv_heads` KV heads (a divisor of Hq):
    {"mapping" [Hq] (the KV head of each query head), "kind" (MHA/GQA/MQA), "group",
     "bytes_per_token", "mha_bytes_per_token", "saved_bytes_per_token", "saved_fraction",
     "table" (heads.kv_cache_table rows for every divisor)}."""
    from . import heads  # local: heads is only needed by the notebook-04 widget

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
    kib = [r["bytes_per_token"] / 1024 for r in rows]
    colors = ["C1" if r["n_kv_heads"] == data["n_kv_heads"] else "#bbbbbb" for r in rows]
    bars = ax_bar.bar(range(len(rows)), kib, color=colors, edgecolor="black")
    for b, r in zip(bars, rows):
        ax_bar.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{r['bytes_per_token']:,}",
                    ha="center", va="bottom", fontsize=8)
    ax_bar.set_xticks(range(len(rows)), labels=labels, fontsize=8)
    ax_bar.set_ylabel("KV cache, KiB per token")
    ax_bar.set_ylim(0, max(kib) * 1.2)
    ax_bar.set_title(f"{data['name']}: {data['bytes_per_token']:,} B/token, "
                     f"saves {data['saved_bytes_per_token']:,} B ({data['saved_fraction']:.0%}) vs MHA",
                     fontsize=9)
    return fig


def kv_heads_widget(config, itemsize=4):
    """Slider "KV heads" over the divisors of config.n_heads (starting at the config's own):
    redraws the head mapping and the bytes per token saved against MHA."""
    from .heads import divisors

    slider = W.SelectionSlider(options=divisors(config.n_heads), value=config.n_kv_heads,
                               description="KV heads", continuous_update=False, style=STYLE)
    return panel({"n_kv_heads": slider}, lambda n_kv_heads: kv_heads_view(config, n_kv_heads, itemsize),
                 kv_heads_figure)


# ----------------------------------------------------------------------------- 05: prefill vs decode

def phase_view(model, tokens, prompt_length, layer=0, batch=1):
    """Prefill the first `prompt_length` tokens, then one decode step with the greedy token.

    Returns {"prompt" [S ids], "next_token", "prefill_weights" [Hq, S, S], "decode_weights"
    [Hq, 1, S+1] (layer `layer`), "prefill_shapes" / "decode_shapes" (phases.phase_shapes),
    "prefill_flops" / "decode_flops" (attention FLOPs of that layer, from the trace)}."""
    from . import phases

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


# ----------------------------------------------------------------------------- 06: the cache, round by round

def cache_step_view(steps, step):
    """Round `step` (1-based; 1 is the prefill) of phases.cached_steps(...):
    {"step", "phase", "input_tokens", "positions", "cache_before", "cache_after", "context",
     "weights" [Hq, S, T], "new_query_weights" [Hq, T] (the round's last query),
     "next_token", "cache_lengths" (after every round up to this one), "capacity" (the
     cache length after the last round, so that every round is drawn on the same axis)}."""
    if not 1 <= int(step) <= len(steps):
        raise ValueError(f"step must be in 1..{len(steps)} (the rounds run), got {step}")
    s = steps[int(step) - 1]
    return {"step": s.step, "phase": s.phase, "input_tokens": s.input_tokens, "positions": s.positions,
            "cache_before": s.cache_before, "cache_after": s.cache_after, "context": s.context,
            "weights": s.weights, "new_query_weights": s.weights[:, -1, :], "next_token": s.next_token,
            "cache_lengths": [x.cache_after for x in steps[:int(step)]], "capacity": steps[-1].cache_after}


def cache_step_figure(data, layer=0):
    """Top: the round's newest query's weights over the cache rows, one row per head (rows
    not in the cache yet hatched). Bottom: the cache, old rows and the rows this round added,
    with the head-averaged weights as bars."""
    T, cap = data["cache_after"], data["capacity"]
    H = data["weights"].shape[0]
    w = np.full((H, cap), np.nan)  # non-finite cells are drawn masked: rows not in the cache yet
    w[:, :T] = data["new_query_weights"]
    labels = viz.token_labels(data["context"][:T]) + [str(j) for j in range(T, cap)]
    fig, (ax_w, ax_c) = plt.subplots(2, 1, figsize=(10, 1.6 + 0.35 * H + 2.0), layout="constrained",
                                     height_ratios=[0.6 + 0.35 * H, 2.0])
    im = viz.heatmap(ax_w, w, [f"head {h}" for h in range(H)], labels,
                     f"round {data['step']} ({data['phase']}): input {data['input_tokens']} at positions "
                     f"{data['positions']}\nlayer {layer}: weights of the newest query (position {T - 1}) "
                     f"over the cache rows", vmin=0, vmax=1, annotate=cap <= 16, colorbar=False,
                     xlabel="cache row (position:token; hatched = not cached yet)", ylabel="")
    viz.cache_strip(ax_c, data["context"], data["cache_before"], T, w[:, :T].mean(axis=0),
                    f"KV cache after round {data['step']}: {T} rows; chosen token {data['next_token']}",
                    capacity=cap)
    fig.colorbar(im, ax=[ax_w, ax_c], fraction=0.03, pad=0.02).set_label("attention weight")
    return fig


def cache_scrubber_widget(model, prompt, max_new_tokens, layer=0):
    """Slider "round": pick a round of cached generation (1 = prefill, then decode steps); see
    which cache rows the new query reads and the cache growing."""
    from .phases import cached_steps

    steps = cached_steps(model, prompt, max_new_tokens, layer=layer)
    slider = W.IntSlider(value=min(2, len(steps)), min=1, max=len(steps), description="round (1 = prefill)",
                         continuous_update=False, style=STYLE)
    box = panel({"step": slider}, lambda step: cache_step_view(steps, step),
                lambda d: cache_step_figure(d, layer))
    box.steps = steps
    return box


# ----------------------------------------------------------------------------- 10: chunked prefill

def chunked_prefill_view(model, token_ids, chunk_size):
    """Prefill token_ids in chunks of chunk_size and in one shot; compare.
    -> {"chunk_size", "spans" [(a, b)], "masks" [[b-a, b] additive], "forward_calls",
        "max_abs_diff" (max |Δ logits| over every position), "same_next_token",
        "score_pairs" (per chunk), "one_shot_pairs"}."""
    from .chunked import chunk_masks, prefill_chunked
    from .generate import work_counts
    from .model import forward

    ids = check_token_ids(model.config, token_ids)
    run = prefill_chunked(model, ids, chunk_size)
    full = forward(model, ids)  # [S, V]
    return {"chunk_size": int(chunk_size), "spans": run.spans, "masks": chunk_masks(len(ids), chunk_size),
            "forward_calls": len(run.spans), "max_abs_diff": float(np.max(np.abs(run.logits - full))),
            "same_next_token": int(np.argmax(run.last_logits)) == int(np.argmax(full[-1])),
            "score_pairs": list(run.score_pairs), "one_shot_pairs": work_counts(model.config, 0, len(ids))[1]}


def chunked_prefill_text(view) -> str:
    return (f"chunk size {view['chunk_size']}: {view['forward_calls']} forward calls, chunks "
            f"{[b - a for a, b in view['spans']]}; score pairs per chunk {view['score_pairs']} "
            f"(sum {sum(view['score_pairs'])} = one shot {view['one_shot_pairs']}); "
            f"max |Δ logits| vs one shot = {view['max_abs_diff']:.1e}; "
            f"same next token: {view['same_next_token']}")


def chunked_prefill_figure(view, labels=None):
    n = view["spans"][-1][1]
    if len(view["spans"]) <= 6:
        fig = viz.chunk_mask_panels(n, view["chunk_size"], labels=labels,
                                    title=f"chunk size {view['chunk_size']}: one mask per forward call")
    else:
        fig, ax = plt.subplots(figsize=(6.5, 5), layout="constrained")
        viz.chunk_overview(ax, n, view["chunk_size"], labels=labels,
                           title=f"chunk size {view['chunk_size']}: {len(view['spans'])} chunks (framed)")
    return fig


def chunked_prefill_widget(model, token_ids, labels=None, max_chunk=None):
    """Slider "chunk size": the chunk masks of a chunked prefill, and its equality with one shot."""
    ids = [int(t) for t in check_token_ids(model.config, token_ids)]
    size = W.IntSlider(value=min(4, len(ids)), min=1, max=max_chunk or len(ids), description="chunk size",
                       continuous_update=False, style=STYLE)

    def draw(view):
        show(chunked_prefill_figure(view, labels))
        return chunked_prefill_text(view)

    return panel({"chunk_size": size}, lambda chunk_size: chunked_prefill_view(model, ids, chunk_size), draw)


# ----------------------------------------------------------------------------- 11: continuous batching

def schedule_view(model, requests, token_budget, policy="decode_first"):
    """The continuous-batching schedule of `requests` at this token budget and policy, the
    one-request-at-a-time baseline, and a per-request table.
    -> {"schedule", "baseline", "rows" (dicts: request, arrival, ttft and tpot both ways), "summary"}."""
    from .scheduler import run_one_at_a_time, run_schedule

    sched = run_schedule(model, requests, token_budget=token_budget, policy=policy)
    base = run_one_at_a_time(model, requests)
    rows = [{"request": m["request"], "arrival": m["arrival"], "prompt": m["prompt"], "new": m["new"],
             "ttft": m["ttft"], "tpot": m["tpot"], "ttft_one_at_a_time": b["ttft"], "tpot_one_at_a_time": b["tpot"]}
            for m, b in zip(sched.metrics(), base.metrics())]
    return {"schedule": sched, "baseline": base, "rows": rows,
            "summary": {"continuous": sched.summary(), "one at a time": base.summary()}}


def schedule_table(view):
    """A viz.Table of schedule_view's rows, plus a last row with the totals."""
    rows = [[r["request"], r["arrival"], r["prompt"], r["new"], r["ttft"], r["tpot"], r["ttft_one_at_a_time"],
             r["tpot_one_at_a_time"]] for r in view["rows"]]
    s, b = view["summary"]["continuous"], view["summary"]["one at a time"]
    rows.append(["mean / total steps", "", "", "", s["mean_ttft"], s["mean_tpot"], b["mean_ttft"], b["mean_tpot"]])
    rows.append(["total engine steps", "", "", "", s["total_steps"], "", b["total_steps"], ""])
    return viz.Table(["request", "arrival", "prompt", "new", "TTFT", "TPOT", "TTFT 1-at-a-time", "TPOT 1-at-a-time"],
                     rows, caption="TTFT and TPOT in engine steps, continuous batching vs one request at a time")


def schedule_widget(model, patterns, budgets=(1, 32), value=8):
    """Slider "token budget", dropdowns "arrivals" (patterns: {name: [Request]}) and "policy":
    the Gantt timeline, the batch sizes and the TTFT/TPOT table against one-at-a-time."""
    from .scheduler import POLICIES

    budget = W.IntSlider(value=value, min=budgets[0], max=budgets[1], description="token budget",
                         continuous_update=False, style=STYLE)
    pattern = W.Dropdown(options=list(patterns), value=list(patterns)[0], description="arrivals", style=STYLE)
    policy = W.Dropdown(options=list(POLICIES), value=POLICIES[0], description="policy", style=STYLE)

    def compute(token_budget, pattern, policy):
        return schedule_view(model, patterns[pattern], token_budget, policy)

    def draw(view):
        s = view["schedule"]
        show(viz.schedule_figure(s, title=f"token budget {s.token_budget}: {s.total_steps} steps"))
        return schedule_table(view)

    return panel({"token_budget": budget, "pattern": pattern, "policy": policy}, compute, draw)


# ----------------------------------------------------------------------------- 12: sampling

def sampling_figure(view, labels):
    """Bars of the best tokens: grey = probability at temperature 1 with nothing filtered,
    colour = the distribution the sampler draws from (zero for tokens filtered out)."""
    ids = view["ids"]
    x = np.arange(len(ids))
    fig, ax = plt.subplots(figsize=(11, 3.6), layout="constrained")
    ax.bar(x - 0.2, view["base"], 0.4, color="#c8c8c8", label="temperature 1, no filter")
    colors = ["C0" if k else "#f0f0f0" for k in view["kept"]]
    ax.bar(x + 0.2, view["probs"], 0.4, color=colors, edgecolor="C0", label="sampled from (kept)")
    ax.set_xticks(x)
    name = labels if callable(labels) else labels.__getitem__
    ax.set_xticklabels([repr(name(int(i))) for i in ids], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("probability")
    ax.set_xlabel("next token (best first)")
    s = view["settings"]
    mode = "greedy" if view["greedy"] else (f"T={s['temperature'] if s['temperature'] is not None else 1}, "
                                            f"top-k={s['top_k'] or 'off'}, top-p={s['top_p'] or 'off'}")
    ax.set_title(f"{mode}: {view['n_kept']} token(s) kept, holding {view['kept_base_mass']:.3f} "
                 f"of the temperature-1 mass")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    return fig


def sampling_widget(logits, labels, n_show=15):
    """Sliders "temperature" (0 = greedy), "top-k" (0 = off) and "top-p" (1 = off) redraw the
    kept set and the probabilities of the best `n_show` tokens. labels: a sequence (labels[id])
    or a function (labels(id)) giving a token's text."""
    from .sampling import distribution_view

    temperature = W.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.05, description="temperature",
                                continuous_update=False, style=STYLE)
    top_k = W.IntSlider(value=0, min=0, max=50, description="top-k (0 = off)", continuous_update=False, style=STYLE)
    top_p = W.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top-p (1 = off)",
                          continuous_update=False, style=STYLE)

    def compute(temperature, top_k, top_p):
        return distribution_view(logits, temperature, top_k or None, None if top_p >= 1.0 else top_p, n_show)

    return panel({"temperature": temperature, "top_k": top_k, "top_p": top_p}, compute,
                 lambda view: sampling_figure(view, labels), title="next-token distribution")


# ----------------------------------------------------------------------------- 13: RoPE

def rope_figure(view, pairs=(0, 1, 2, -1)):
    """For a few pairs: q's and k's 2-D pieces after rotation (arrows, faint: before), and
    every pair's share of the score q . k as bars."""
    n_pairs = len(view["angle_q"])
    pairs = [p % n_pairs for p in pairs]
    fig, axes = plt.subplots(1, len(pairs) + 1, figsize=(3.0 * (len(pairs) + 1) + 1, 3.2), layout="constrained")
    lim = 1.2 * max(np.linalg.norm(view["q"], axis=1).max(), np.linalg.norm(view["k"], axis=1).max())
    for ax, p in zip(axes, pairs):
        viz.arrows_2d(ax, {"q": view["q_rot"][p], "k": view["k_rot"][p]}, limit=lim, colors=["C0", "C3"])
        for vec, color in ((view["q"][p], "C0"), (view["k"][p], "C3")):
            ax.annotate("", xy=vec, xytext=(0, 0), arrowprops=dict(arrowstyle="->", lw=1, color=color, alpha=0.3))
        a, b = view["pairs"][p]
        ax.set_xlabel(f"dim {a}")
        ax.set_ylabel(f"dim {b}")
        ax.set_title(f"pair {p}: q turned {np.degrees(view['angle_q'][p]):.0f}°,\n"
                     f"k turned {np.degrees(view['angle_k'][p]):.0f}°", fontsize=9)
    ax = axes[-1]
    ax.bar(np.arange(n_pairs), view["pair_scores"], color="C2")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xlabel("pair i")
    ax.set_ylabel("q_i . k_i")
    ax.set_title(f"score {view['score']:.3f} at distance {view['distance']}", fontsize=9)
    fig.suptitle(f"query at position {view['pos_q']}, key at position {view['pos_k']}", fontsize=10)
    return fig


def rope_widget(q, k, base=10000.0, layout="halves", max_position=64, pairs=(0, 1, 2, -1)):
    """Sliders "query position", "key position" and "shift both by": the rotated pairs and the
    score; shifting both positions turns every arrow but leaves the score unchanged."""
    from .rope import pair_view

    pos_q = W.IntSlider(value=5, min=0, max=max_position, description="query position", continuous_update=False,
                        style=STYLE)
    pos_k = W.IntSlider(value=2, min=0, max=max_position, description="key position", continuous_update=False,
                        style=STYLE)
    shift = W.IntSlider(value=0, min=0, max=max_position, description="shift both by", continuous_update=False,
                        style=STYLE)

    def compute(pos_q, pos_k, shift):
        return pair_view(q, k, pos_q + shift, pos_k + shift, base, layout)

    return panel({"pos_q": pos_q, "pos_k": pos_k, "shift": shift}, compute,
                 lambda view: rope_figure(view, pairs), title="RoPE: rotated query and key")


# ----------------------------------------------------------------------------- 14: roofline

def roofline_figure(bandwidth_gbps, peak_gflops, points=None, ax=None, title=None):
    """Log-log roofline: the bandwidth slope and the matmul roof, with ops placed on it.
    points: {label: (intensities [n], GFLOP/s [n], names [n] or None)}, one marker style each."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    xs = np.logspace(-2, 3, 200)  # FLOP/byte
    ax.loglog(xs, np.minimum(peak_gflops, bandwidth_gbps * xs), color="black", linewidth=2, label="roofline")
    ridge = peak_gflops / bandwidth_gbps
    ax.axvline(ridge, color="#999999", linestyle=":", linewidth=1)
    ax.text(ridge * 1.1, peak_gflops * 0.05, f"ridge {ridge:.1f} FLOP/byte", fontsize=8, color="#555555")
    for i, (label, (xv, yv, names)) in enumerate((points or {}).items()):
        ax.scatter(xv, yv, s=40, marker="os^Dv"[i % 5], color=f"C{i}", label=label, zorder=3)
        spots = {}  # ops at (nearly) the same point share one label
        for x, y, name in zip(xv, yv, names or []):
            key = (round(float(np.log10(x)), 1), round(float(np.log10(y)), 1))
            spots.setdefault(key, (x, y, []))[2].append(name)
        above = i % 2 == 0  # the first series labelled above its points, the second below
        for x, y, group in spots.values():
            if len(group) > 2:  # a crowd: a small block of text beside the point
                text = "\n".join(", ".join(group[k:k + 3]) for k in range(0, len(group), 3))
                ax.annotate(text, (x, y), textcoords="offset points", xytext=(8, 4 if above else -4), fontsize=7,
                            color=f"C{i}", ha="left", va="bottom" if above else "top")
            else:
                ax.annotate(", ".join(group), (x, y), textcoords="offset points", xytext=(2, 7 if above else -7),
                            fontsize=7, color=f"C{i}", rotation=50 if above else -50, rotation_mode="anchor",
                            ha="left", va="bottom" if above else "top")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(bandwidth_gbps * xs[0] * 0.5, peak_gflops * 30)  # room for the labels above the roof
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    return fig if fig is not None else ax


def roofline_widget(intensities_by_batch, bandwidth_gbps, peak_gflops, prefill=None):
    """Slider "decode batch size": the ops of one layer's decode step for that batch on the
    roofline (and, when given, the prefill's ops for comparison)."""
    from .bench import roofline_view

    batch = W.SelectionSlider(options=list(intensities_by_batch), value=list(intensities_by_batch)[0],
                              description="decode batch size", continuous_update=False, style=STYLE)

    def compute(batch):
        return roofline_view(intensities_by_batch[batch], bandwidth_gbps, peak_gflops) | {"batch": batch}

    def draw(view):
        points = {f"decode, batch {view['batch']}": (view["intensity"], view["attainable"], view["ops"])}
        if prefill is not None:
            pv = roofline_view(prefill, bandwidth_gbps, peak_gflops)
            points["prefill"] = (pv["intensity"], pv["attainable"], None)
        n_mem = view["bound"].count("memory")
        return roofline_figure(bandwidth_gbps, peak_gflops, points,
                               title=f"decode batch {view['batch']}: {n_mem} of {len(view['ops'])} ops memory-bound")

    return panel({"batch": batch}, compute, draw, title="roofline")


# ----------------------------------------------------------------------------- 08: KV capacity

CAPACITY_DTYPES = ("float32", "bfloat16", "float16", "fp8")
HEAD_DIMS = (32, 48, 64, 80, 96, 128, 160, 192, 256)
CONTEXTS = tuple(2 ** k for k in range(8, 18))  # 256 .. 131072


def capacity_text(data, n_layers, n_kv_heads, head_dim, dtype, context, budget_gib) -> str:
    """The capacity widget's output as text (from `capacity.capacity_for`'s numbers)."""
    from .capacity import bytes_per_element, format_bytes

    b = bytes_per_element(dtype)
    return "\n".join([
        f"bytes per token   = 2 x {n_layers} layers x {n_kv_heads} KV heads x {head_dim} x {b} B "
        f"= {data['bytes_per_token']:,} B ({format_bytes(data['bytes_per_token'])})",
        f"bytes per request = {data['bytes_per_token']:,} B x {context:,} tokens "
        f"= {data['bytes_per_request']:,} B ({format_bytes(data['bytes_per_request'])})",
        f"in {budget_gib:g} GiB: {data['requests']:,} requests of {context:,} tokens "
        f"({data['tokens']:,} tokens in all)"])


def capacity_widget(n_layers=30, n_kv_heads=3, head_dim=64, dtype="float32", context=8192, budget_gib=8.0):
    """Sliders "layers", "KV heads", "head dim", "context (tokens)", "KV budget (GiB)" and a
    dropdown "dtype": prints bytes per token, per request, and how many requests fit."""
    from .capacity import capacity_for

    controls = {
        "n_layers": W.IntSlider(value=n_layers, min=1, max=128, description="layers", continuous_update=False,
                                style=STYLE),
        "n_kv_heads": W.IntSlider(value=n_kv_heads, min=1, max=64, description="KV heads", continuous_update=False,
                                  style=STYLE),
        "head_dim": W.SelectionSlider(options=HEAD_DIMS, value=head_dim, description="head dim",
                                      continuous_update=False, style=STYLE),
        "dtype": W.Dropdown(options=CAPACITY_DTYPES, value=dtype, description="dtype", style=STYLE),
        "context": W.SelectionSlider(options=CONTEXTS, value=context, description="context (tokens)",
                                     continuous_update=False, style=STYLE),
        "budget_gib": W.FloatSlider(value=budget_gib, min=0.5, max=160.0, step=0.5, description="KV budget (GiB)",
                                    continuous_update=False, style=STYLE),
    }

    def compute(**values):
        return dict(capacity_for(**values), values=values)

    return panel(controls, compute, lambda d: capacity_text(d, **d["values"]), title="KV cache capacity")


# ----------------------------------------------------------------------------- 09: paged cache

def block_size_figure(view):
    """The block tables at the view's step, titled with the waste numbers."""
    table = view["table"]
    live = np.flatnonzero((table >= 0).any(axis=1))
    fig, ax = plt.subplots(figsize=(min(3 + 0.45 * table.shape[1], 13), 1.2 + 0.32 * max(len(live), 1)),
                           layout="constrained")
    viz.block_table_heatmap(ax, table[live] if len(live) else table[:1], [f"r{i}" for i in live] or None,
                            f"step {view['step']}, block size {view['block_size']}: {view['tokens']} positions in "
                            f"{view['paged_slots']} slots, waste {view['paged_waste']} "
                            f"(contiguous: {view['reserved']} reserved, waste {view['contiguous_waste']})",
                            ylabel="request", annotate=table.shape[1] <= 24)
    ax.title.set_fontsize(9)
    return fig


def block_size_widget(trace, step, sizes=(1, 2, 4, 8, 16, 32), value=4):
    """Slider "block size": the block tables of the running requests at `step` of the trace, and
    the waste (allocated slots - positions) of paging vs contiguous reservation."""
    from .paged import block_size_view

    slider = W.SelectionSlider(options=list(sizes), value=value, description="block size",
                               continuous_update=False, style=STYLE)
    return panel({"block_size": slider},
                 lambda block_size: block_size_view(trace, block_size, step) | {"block_size": block_size},
                 block_size_figure, title="paged KV cache: block size vs waste")


# ----------------------------------------------------------------------------- 07: a real model

def first_token_mass(trace, seq=0, from_position=1):
    """How much attention goes to position 0: for every layer and query head, the weight on key 0
    averaged over the queries at positions >= from_position (the query at position 0 can only
    attend to itself, so it says nothing). Read from trace.attention_weights of a traced forward.
    -> array [L, Hq], layers in order."""
    layers = sorted(l for (l, s) in trace.attention_weights if s == seq)
    if not layers:
        raise ValueError(f"the trace holds no attention weights for sequence {seq}; "
                         f"run forward(model, ids, trace=Trace()) first")
    out = []
    for l in layers:
        w = trace.attention_weights[(l, seq)]  # [Hq, S, T]
        S, T = w.shape[1:]
        rows = T - S + np.arange(S) >= int(from_position)  # query i sits at position T - S + i
        if not rows.any():
            raise ValueError(f"no query at a position >= {from_position} (the last query is at {T - 1})")
        out.append(w[:, rows, 0].mean(axis=1))  # [Hq]
    return np.array(out)


def attention_view(trace, config, layer, head="all", log_scale=False, *, seq=0, floor=viz.LOG_FLOOR):
    """One layer's attention weights from a traced forward, for the attention explorer.

    head: "all" (every query head) or a query head index. Returns {"layer", "heads" [h],
    "kv_heads" [h] (the KV head each reads), "weights" [h, S, T], "shown" (log10 weights with
    log_scale, see viz.log_attention; else the weights), "log_scale", "first_token_mass" [h]
    (weight on position 0, averaged over queries at positions >= 1)}."""
    if (int(layer), seq) not in trace.attention_weights:
        raise ValueError(f"layer {layer} is not in the trace: traced layers are "
                         f"{sorted(l for l, s in trace.attention_weights if s == seq)}")
    weights = trace.attention_weights[(int(layer), seq)]  # [Hq, S, T]
    if weights.shape[0] != config.n_heads:
        raise ValueError(f"the trace has {weights.shape[0]} heads but the config {config.n_heads}")
    if head == "all":
        heads = list(range(config.n_heads))
    elif isinstance(head, (int, np.integer)) and not isinstance(head, bool) and 0 <= head < config.n_heads:
        heads = [int(head)]
    else:
        raise ValueError(f"head must be 'all' or a query head in 0..{config.n_heads - 1}, got {head!r}")
    w = np.asarray(weights[heads], dtype=np.float64)  # [h, S, T]
    mass = first_token_mass(trace, seq)[int(layer), heads] if w.shape[2] > 1 else np.ones(len(heads))
    return {"layer": int(layer), "heads": heads, "kv_heads": [config.kv_head_of(h) for h in heads],
            "weights": w, "shown": viz.log_attention(w, floor) if log_scale else w, "log_scale": bool(log_scale),
            "first_token_mass": mass, "floor": floor}


def attention_view_figure(view, labels=None, group_size=1):
    """All heads: a grid with one row per KV head (group_size query heads each). One head: a
    single annotated heatmap. Log scale when the view says so."""
    names = [f"head {h} → KV {g}" for h, g in zip(view["heads"], view["kv_heads"])]
    scale = "log scale" if view["log_scale"] else "linear scale"
    if len(view["heads"]) > 1:
        return viz.head_grid(view["weights"], labels, labels, ncols=group_size, log=view["log_scale"],
                             floor=view["floor"], head_names=names,
                             title=f"layer {view['layer']}, {scale}: mean weight on position 0 = "
                                   f"{float(np.mean(view['first_token_mass'])):.2f}")
    S = view["weights"].shape[1]
    fig, ax = plt.subplots(figsize=(1.6 + 0.42 * S, 1.2 + 0.38 * S), layout="constrained")
    log = view["log_scale"]
    viz.heatmap(ax, view["shown"][0], labels, labels,
                f"layer {view['layer']}, {names[0]} ({scale}): weight on position 0 = "
                f"{float(view['first_token_mass'][0]):.2f}", mask="causal",
                vmin=float(np.log10(view["floor"])) if log else 0.0, vmax=0.0 if log else 1.0,
                annotate=S <= 16, fmt="{:.1f}" if log else "{:.2f}",
                cbar_label="log10 weight" if log else "weight", xlabel="key", ylabel="query")
    ax.title.set_fontsize(9)
    return fig


def attention_explorer_widget(trace, config, labels=None, layer=0, head="all", log_scale=False):
    """Slider "layer", dropdown "head" ("all" or one query head, with its KV head) and checkbox
    "log scale": redraws that layer's attention heatmaps from a traced forward (nothing is
    recomputed, so it is quick even for a real model)."""
    layers = sorted(l for l, s in trace.attention_weights if s == 0)
    if not layers:
        raise ValueError("the trace holds no attention weights; run forward(model, ids, trace=Trace()) first")
    layer_slider = W.IntSlider(value=layer, min=layers[0], max=layers[-1], description="layer",
                               continuous_update=False, style=STYLE)
    options = [("all heads", "all")] + [(f"head {h} (KV {config.kv_head_of(h)})", h) for h in range(config.n_heads)]
    head_dropdown = W.Dropdown(options=options, value=head, description="query head", style=STYLE)
    log_box = W.Checkbox(value=log_scale, description="log scale", style=STYLE)
    return panel({"layer": layer_slider, "head": head_dropdown, "log_scale": log_box},
                 lambda layer, head, log_scale: attention_view(trace, config, layer, head, log_scale),
                 lambda view: attention_view_figure(view, labels, config.group_size),
                 title="attention of a real model, head by head")
