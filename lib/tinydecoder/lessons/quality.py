"""What a speed-up costs in quality: perplexity of a fixed text, and KL to the float32 model.

The text is shipped (`data/pydoc_topics_eval.txt`): five topics of the Python documentation as
`pydoc_data.topics` held them in the Python version recorded in `data/pydoc_topics.json` (that
module's text changes between releases, so a number measured on it would drift; the copy does
not). `topic_text("assignment")` gives one topic back, character for character.

Scoring in windows. A text of N tokens is cut into windows of `context` tokens whose starts are
`stride` apart (0, stride, 2*stride, ...; the last one ends at N and starts `context` before it,
so it is not shorter than the others). Each window is one fresh
forward pass (a new cache): row i of its logits predicts the window's token i + 1. Every token
from position 1 on is scored exactly once, by the first window that holds it with its
prediction row, so the first window scores its tokens 1..context-1 and every later window only
those past the previous window's end: each of those sees at least `context - stride` tokens of
context. Per scored token, NLL = -log softmax(logits)[token], accumulated in float64 over float32
logits; perplexity = exp(mean NLL).

KL to the reference: for the same windows, the float32 model's next-token distribution p and the
variant's q, KL(p || q) = sum_v p_v (log p_v - log q_v), averaged over the scored tokens. Both
passes run window by window and only the scored rows' log-probabilities of one window are held
at a time (never the whole text's logits).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..core.validate import is_int

DATA = Path(__file__).resolve().parent / "data"
EVAL_TEXT = "pydoc_topics_eval.txt"
CALIBRATION_TEXT = "pydoc_topics_calibration.txt"
SOURCES = "pydoc_topics.json"
ROW_BLOCK = 64  # rows of a window's log-softmax done at once: 64 x 49,152 float64 = 25 MB per array


@lru_cache(maxsize=1)
def text_sources() -> dict:
    """Where the shipped texts come from: Python version, topic names and their character spans."""
    return json.loads((DATA / SOURCES).read_text(encoding="utf-8"))


def shipped_text(name: str = EVAL_TEXT) -> str:
    """A shipped text by file name: EVAL_TEXT (the default) or CALIBRATION_TEXT."""
    files = text_sources()["files"]
    if name not in files:
        raise ValueError(f"no shipped text {name!r}; the texts are {sorted(files)}")
    return (DATA / name).read_text(encoding="utf-8")


def topic_text(topic: str) -> str:
    """One topic of a shipped text, equal to pydoc_data.topics.topics[topic] in the recorded
    Python version (e.g. topic_text("assignment") for notebook 13)."""
    for name, info in text_sources()["files"].items():
        for title, start, end in info["spans"]:
            if title == topic:
                return shipped_text(name)[start:end]
    known = [t for info in text_sources()["files"].values() for t in info["topics"]]
    raise ValueError(f"no shipped topic {topic!r}; the shipped topics are {known}")


# ----------------------------------------------------------------------------- windows

@dataclass(frozen=True)
class Window:
    start: int  # first token of the window
    end: int  # one past its last token
    first_target: int  # first token it scores (its rows first_target-1-start .. end-2-start)

    @property
    def scored(self) -> int:
        return self.end - self.first_target


def check_windows(n_tokens: int, context: int, stride: int) -> None:
    """Clear errors for a window length, stride and token count that cannot work together."""
    for name, value, low in (("context", context, 2), ("stride", stride, 1), ("tokens", n_tokens, 2)):
        if not is_int(value) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if stride >= context:
        raise ValueError(f"stride must be in 1..context-1 = 1..{context - 1} (windows must overlap, so that "
                         f"each scored token has context), got stride={stride} for context={context}")


def windows(n_tokens: int, context: int = 512, stride: int = 256) -> list:
    """The windows that score tokens 1..n_tokens-1 once each (see the module docstring)."""
    check_windows(n_tokens, context, stride)
    out, start, done = [], 0, 1  # `done`: the first token not scored yet
    while done < n_tokens:
        end = min(start + context, n_tokens)
        out.append(Window(max(0, end - context), end, done))  # the last window reaches back a full context
        done, start = end, start + stride
    return out


# ----------------------------------------------------------------------------- scoring

def log_softmax(logits) -> np.ndarray:
    """log softmax of float32 (or any) logits [n, V], computed in float64."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def window_rows(logits, window: Window) -> np.ndarray:
    """The rows of a window's logits [end - start, V] that predict its scored tokens."""
    logits = np.asarray(logits)
    if logits.ndim != 2 or len(logits) != window.end - window.start:
        raise ValueError(f"a forward over a window of {window.end - window.start} tokens must return that many "
                         f"rows of logits, got shape {logits.shape}")
    return logits[window.first_target - 1 - window.start: window.end - 1 - window.start]


def score_rows(rows, targets, reference_rows=None) -> tuple:
    """(NLL per target [n] float64, KL(p_ref || p) per target [n] float64, or None) for the rows
    [n, V] that predict `targets` [n]; processed ROW_BLOCK rows at a time."""
    targets = np.asarray(targets)
    nll, kl = np.empty(len(targets)), None if reference_rows is None else np.empty(len(targets))
    for a in range(0, len(targets), ROW_BLOCK):
        b = min(a + ROW_BLOCK, len(targets))
        logq = log_softmax(rows[a:b])
        nll[a:b] = -logq[np.arange(b - a), targets[a:b]]
        if kl is not None:
            logp = log_softmax(reference_rows[a:b])
            kl[a:b] = np.einsum("nv,nv->n", np.exp(logp), logp - logq)
    return nll, kl


@dataclass
class Score:
    nll: np.ndarray  # [tokens - 1] float64, token 1 onwards
    kl: np.ndarray | None  # [tokens - 1] float64 against the reference, None for the reference itself
    windows: list
    seconds: float
    reference_nll: np.ndarray | None = None

    @property
    def perplexity(self) -> float:
        return float(math.exp(self.nll.mean()))

    @property
    def mean_kl(self) -> float:
        return 0.0 if self.kl is None else float(self.kl.mean())


def score(run, token_ids, context: int = 512, stride: int = 256, reference=None, progress=None) -> Score:
    """Score `token_ids` with `run(window_ids) -> logits [len, V]` (one fresh pass per window).

    reference: the float32 model's `run`, for the KL (None: `run` is the reference, KL 0).
    progress: a tqdm-like factory `progress(total=..., desc=...)`, or None for no bar."""
    ids = np.asarray(token_ids, dtype=np.int64)
    plan = windows(len(ids), context, stride)
    nll, kl = np.empty(len(ids) - 1), None if reference is None else np.empty(len(ids) - 1)
    ref_nll = None if reference is None else np.empty(len(ids) - 1)
    bar = progress(total=len(plan), desc="eval", unit="window") if progress else None
    start = time.perf_counter()
    for w in plan:
        piece = ids[w.start:w.end]
        rows = window_rows(run(piece), w)
        ref_rows = None if reference is None else window_rows(reference(piece), w)
        targets = ids[w.first_target:w.end]
        a, b = w.first_target - 1, w.end - 1
        nll[a:b], k = score_rows(rows, targets, ref_rows)
        if reference is not None:
            kl[a:b] = k
            ref_nll[a:b], _ = score_rows(ref_rows, targets)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return Score(nll, kl, plan, time.perf_counter() - start, ref_nll)
