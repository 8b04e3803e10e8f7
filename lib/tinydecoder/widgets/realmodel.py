"""Widgets of Part I's later chapters: the cache scrubber, a real model's attention, sampling, RoPE."""

from __future__ import annotations

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np

from .. import viz
from ..core.reference import LAYER_STEPS, decoder_block, layer_input  # noqa: F401 (notebooks use widgets.layer_input)
from ..core.validate import is_int
from .base import STYLE, panel, show  # noqa: F401

# ----------------------------------------------------------------------------- 07: the cache, round by round

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
    from ..lessons.phases import cached_steps

    steps = cached_steps(model, prompt, max_new_tokens, layer=layer)
    slider = W.IntSlider(value=min(2, len(steps)), min=1, max=len(steps), description="round (1 = prefill)",
                         continuous_update=False, style=STYLE)
    box = panel({"step": slider}, lambda step: cache_step_view(steps, step),
                lambda d: cache_step_figure(d, layer))
    box.steps = steps
    return box
# ----------------------------------------------------------------------------- 09: sampling

SAMPLING_LOG_FLOOR = 1e-6  # the bottom of the log-scale axis: smaller probabilities sit on it


def sampling_bars(view, log_scale=False, floor=SAMPLING_LOG_FLOOR):
    """The bar heights and axis of the sampling figure for a lessons.sampling_view.distribution_view.

    Linear: the probabilities, axis 0..1.02. Log scale: the probabilities clipped up to `floor`
    (a token filtered out, probability 0, sits on the floor), axis floor..1.5 on a log10 scale,
    so that probabilities of 1e-2 .. 1e-5 (the tail) are as visible as the best token's.
    Returns {"base", "probs" [n], "yscale", "ylim", "ylabel", "below_floor" (how many of the
    sampled-from bars are under the floor, zeros included)}."""
    if not 0 < floor < 1:
        raise ValueError(f"floor must be in (0, 1), got {floor}")
    base, probs = np.asarray(view["base"], dtype=np.float64), np.asarray(view["probs"], dtype=np.float64)
    if not log_scale:
        return {"base": base, "probs": probs, "yscale": "linear", "ylim": (0.0, 1.02), "ylabel": "probability",
                "below_floor": 0}
    return {"base": np.maximum(base, floor), "probs": np.maximum(probs, floor), "yscale": "log",
            "ylim": (floor, 1.5), "ylabel": "probability (log scale)", "below_floor": int((probs < floor).sum())}


def sampling_figure(view, labels, log_scale=False):
    """Bars of the best tokens: grey = probability at temperature 1 with nothing filtered,
    colour = the distribution the sampler draws from (zero for tokens filtered out); on a log
    scale with log_scale (see sampling_bars)."""
    ids = view["ids"]
    bars = sampling_bars(view, log_scale)
    x = np.arange(len(ids))
    fig, ax = plt.subplots(figsize=(11, 3.6), layout="constrained")
    bottom = bars["ylim"][0] if log_scale else 0.0
    ax.bar(x - 0.2, bars["base"] - bottom, 0.4, bottom=bottom, color="#c8c8c8", label="temperature 1, no filter")
    colors = ["C0" if k else "#f0f0f0" for k in view["kept"]]
    ax.bar(x + 0.2, bars["probs"] - bottom, 0.4, bottom=bottom, color=colors, edgecolor="C0",
           label="sampled from (kept)")
    ax.set_yscale(bars["yscale"])
    ax.set_xticks(x)
    name = labels if callable(labels) else labels.__getitem__
    ax.set_xticklabels([repr(name(int(i))) for i in ids], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel(bars["ylabel"])
    ax.set_xlabel("next token (best first)")
    s = view["settings"]
    mode = "greedy" if view["greedy"] else (f"T={s['temperature'] if s['temperature'] is not None else 1}, "
                                            f"top-k={s['top_k'] or 'off'}, top-p={s['top_p'] or 'off'}")
    ax.set_title(f"{mode}: {view['n_kept']} token(s) kept, holding {view['kept_base_mass']:.3f} "
                 f"of the temperature-1 mass")
    ax.set_ylim(*bars["ylim"])
    ax.legend(fontsize=8)
    return fig


def sampling_widget(logits, labels, n_show=15, log_scale=False):
    """Sliders "temperature" (0 = greedy), "top-k" (0 = off) and "top-p" (1 = off) redraw the
    kept set and the probabilities of the best `n_show` tokens; checkbox "log scale" shows the
    small probabilities of the tail. labels: a sequence (labels[id]) or a function (labels(id))
    giving a token's text."""
    from ..lessons.sampling_view import distribution_view

    temperature = W.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.05, description="temperature",
                                continuous_update=False, style=STYLE)
    top_k = W.IntSlider(value=0, min=0, max=50, description="top-k (0 = off)", continuous_update=False, style=STYLE)
    top_p = W.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top-p (1 = off)",
                          continuous_update=False, style=STYLE)
    log_box = W.Checkbox(value=log_scale, description="log scale", style=STYLE)

    def compute(temperature, top_k, top_p, log_scale):
        view = distribution_view(logits, temperature, top_k or None, None if top_p >= 1.0 else top_p, n_show)
        return {**view, "log_scale": bool(log_scale)}

    return panel({"temperature": temperature, "top_k": top_k, "top_p": top_p, "log_scale": log_box}, compute,
                 lambda view: sampling_figure(view, labels, view["log_scale"]), title="next-token distribution")
# ----------------------------------------------------------------------------- 04: RoPE

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
    from ..lessons.rope_lab import pair_view

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
# ----------------------------------------------------------------------------- 08: a real model

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
    elif is_int(head) and 0 <= head < config.n_heads:
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


def explorer_view(traces, config, layer, head="all", log_scale=False, prompt=None, *, model=None,
                  tokenizer=None, max_tokens=None, keep=8):
    """What the attention explorer draws: attention_view of the trace of `prompt` plus its
    "labels" and "prompt". traces: dict prompt -> (trace, labels), filled on demand by tracing
    a new prompt through `model` (lessons.real_model.trace_prompt, at most `max_tokens` tokens;
    only the `keep` latest prompts are held). A prompt that cannot be traced (empty, too long)
    gives {"error": message} instead of raising, so the widget shows the message."""
    from ..lessons.real_model import MAX_PROMPT_TOKENS, trace_prompt

    if prompt not in traces:
        if model is None or tokenizer is None:
            raise ValueError(f"prompt {prompt!r} has no trace and no model/tokenizer to trace it with")
        try:
            t = trace_prompt(model, tokenizer, prompt, max_tokens or MAX_PROMPT_TOKENS)
        except ValueError as e:
            return {"error": str(e), "prompt": prompt}
        while len(traces) >= keep:  # forget the oldest typed prompt (dicts keep insertion order)
            traces.pop(next(iter(traces)))
        traces[prompt] = (t["trace"], t["labels"])
    trace, labels = traces[prompt]
    layer = min(int(layer), max(l for l, s in trace.attention_weights if s == 0))
    return {**attention_view(trace, config, layer, head, log_scale), "labels": labels, "prompt": prompt}


def explorer_figure(view, group_size=1):
    """The explorer's drawing: the heatmaps, or the message of a prompt that could not be traced."""
    if "error" in view:
        return f"Cannot trace this prompt: {view['error']}"
    return attention_view_figure(view, view["labels"], group_size)


def attention_explorer_widget(trace, config, labels=None, layer=0, head="all", log_scale=False, *,
                              model=None, tokenizer=None, prompt=None, max_tokens=None):
    """Slider "layer", dropdown "head" ("all" or one query head, with its KV head) and checkbox
    "log scale": redraws that layer's attention heatmaps from a traced forward (nothing is
    recomputed, so it is quick even for a real model). With `model`, `tokenizer` and the text
    `prompt` that `trace` was traced from, a text box "prompt" lets the learner type another
    prompt (at most max_tokens, default 32 tokens; Enter runs it): the model is run once on it
    and traced. It starts on `trace`, so the first drawing is always the same."""
    layers = sorted(l for l, s in trace.attention_weights if s == 0)
    if not layers:
        raise ValueError("the trace holds no attention weights; run forward(model, ids, trace=Trace()) first")
    if model is not None and (tokenizer is None or not isinstance(prompt, str)):
        raise ValueError("a prompt box needs the tokenizer and the prompt text the trace was made from")
    layer_slider = W.IntSlider(value=layer, min=layers[0], max=layers[-1], description="layer",
                               continuous_update=False, style=STYLE)
    options = [("all heads", "all")] + [(f"head {h} (KV {config.kv_head_of(h)})", h) for h in range(config.n_heads)]
    head_dropdown = W.Dropdown(options=options, value=head, description="query head", style=STYLE)
    log_box = W.Checkbox(value=log_scale, description="log scale", style=STYLE)
    controls = {"layer": layer_slider, "head": head_dropdown, "log_scale": log_box}
    traces = {prompt: (trace, labels)}
    if model is not None:
        controls["prompt"] = W.Text(value=prompt, description="prompt", continuous_update=False, style=STYLE,
                                    layout=W.Layout(width="32em"))

    def compute(layer, head, log_scale, prompt=prompt):
        return explorer_view(traces, config, layer, head, log_scale, prompt, model=model, tokenizer=tokenizer,
                             max_tokens=max_tokens)

    return panel(controls, compute, lambda view: explorer_figure(view, config.group_size),
                 title="attention of a real model, head by head")
