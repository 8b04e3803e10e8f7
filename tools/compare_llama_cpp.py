"""SmolLM2's Q4_1 file run by llama.cpp (through llama-cpp-python) and by tinydecoder's fast path,
in one process, alternating: prefill and decode speed, and whether their greedy tokens agree.

    .venv/bin/pip install llama-cpp-python     # optional, never a dependency: it compiles llama.cpp (~7 min on 2 cores)
    .venv/bin/python tools/compare_llama_cpp.py [--rounds 3] [--threads N] [--json]

Each round times, for each implementation in turn, a prefill of each length (a fresh cache) and
`--steps` greedy decode steps after a 128-token prompt of English text; the table shows the medians
over the rounds and each implementation's speed over llama.cpp's. The same token ids go to every
implementation (prefills: `perf.bench_rows.bench_tokens`). llama.cpp quantises activations to 8 bits and keeps its KV cache
in 16 bits, so its greedy tokens may part from ours at near-ties: the agreement is printed, not
asserted. Without llama_cpp installed it says how to install it and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

INSTALL = ("llama_cpp is not installed: `.venv/bin/pip install llama-cpp-python` (it compiles llama.cpp "
           "from source, ~7 minutes on two cores; it is not a dependency of tinydecoder)")
PROMPT_CONTEXT = 128  # decode steps run after a prompt of this many tokens
ENGLISH = ("The lighthouse keeper climbed the stairs every evening to light the lamp, and every morning "
           "he wrote in his log what ships had passed, what the weather had been and what he had seen.")


class Ours:
    """tinydecoder's fast path on one of load_smollm2's weights ("q4_1" or "f32")."""

    def __init__(self, weights: str):
        import tinydecoder as td

        self.name, self.model = f"tinydecoder {weights}", td.load_smollm2(weights)

    def prefill(self, ids) -> float:
        from tinydecoder import fast

        start = time.perf_counter()
        fast.forward(self.model, ids, self.model.new_cache(len(ids)), last_only=True)
        return time.perf_counter() - start

    def decode(self, prompt, steps: int) -> tuple:
        """(seconds for `steps` greedy decode steps after `prompt`, the greedy tokens)."""
        import numpy as np

        from tinydecoder import fast

        cache = self.model.new_cache(len(prompt) + steps + 1)
        token = int(np.argmax(fast.forward(self.model, prompt, cache, last_only=True)[-1]))
        tokens, start = [token], time.perf_counter()
        for _ in range(steps):
            token = int(np.argmax(fast.forward(self.model, [token], cache, last_only=True)[-1]))
            tokens.append(token)
        return time.perf_counter() - start, tokens


class LlamaCpp:
    """llama.cpp on the same GGUF file (llama-cpp-python's low-level eval: no sampling overhead)."""

    def __init__(self, path: str, threads: int, context: int):
        import llama_cpp

        self.name = f"llama.cpp {getattr(llama_cpp, '__version__', '?')}"
        self.llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=context,
                                   n_batch=min(context, 512), verbose=False)

    def prefill(self, ids) -> float:
        self.llm.reset()
        start = time.perf_counter()
        self.llm.eval(list(ids))
        return time.perf_counter() - start

    def decode(self, prompt, steps: int) -> tuple:
        self.llm.reset()
        self.llm.eval(list(prompt))
        token = self._greedy()
        tokens, start = [token], time.perf_counter()
        for _ in range(steps):
            self.llm.eval([token])
            token = self._greedy()
            tokens.append(token)
        return time.perf_counter() - start, tokens

    def _greedy(self) -> int:
        """The argmax of the last evaluated token's logits (llama.cpp's own buffer: `Llama.scores`
        is filled only with logits_all, which would compute every prompt row's logits)."""
        import numpy as np

        return int(np.argmax(np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))))


def compare(implementations: list, ids_of, prompt, lengths=(100, 500), steps: int = 64, rounds: int = 3) -> dict:
    """{name: {"prefill_seconds": {n: median}, "decode_tokens_per_second": median, "tokens": [...]}}:
    prefills of ids_of(n) for each n of `lengths`, and `steps` greedy decode steps after `prompt`,
    every round running each implementation in turn (the machine's speed drifts)."""
    runs = {impl.name: {"prefill": {n: [] for n in lengths}, "decode": [], "tokens": None} for impl in implementations}
    for _ in range(rounds):
        for impl in implementations:
            for n in lengths:
                runs[impl.name]["prefill"][n].append(impl.prefill(ids_of(n)))
            seconds, tokens = impl.decode(prompt, steps)
            runs[impl.name]["decode"].append(steps / seconds)
            runs[impl.name]["tokens"] = tokens
    return {name: {"prefill_seconds": {str(n): statistics.median(t) for n, t in r["prefill"].items()},
                   "decode_tokens_per_second": statistics.median(r["decode"]), "tokens": r["tokens"]}
            for name, r in runs.items()}


def table(result: dict, baseline: str) -> list:
    """Lines: each implementation's medians and its speed over `baseline`'s (x > 1: faster)."""
    base = result[baseline]
    lines = []
    for name, r in result.items():
        pre = "  ".join(f"prefill {n}: {s:.3f} s ({base['prefill_seconds'][n] / s:.2f}x)"
                        for n, s in r["prefill_seconds"].items())
        dec = r["decode_tokens_per_second"]
        same = sum(1 for _ in _common_prefix(r["tokens"], base["tokens"]))
        lines.append(f"{name:<22} {pre}  decode at {PROMPT_CONTEXT}: {dec:.1f} tok/s "
                     f"({dec / base['decode_tokens_per_second']:.2f}x); greedy tokens equal to {baseline}'s: "
                     f"first {same} of {len(r['tokens'])}")
    return lines


def _common_prefix(a, b):
    for x, y in zip(a, b):
        if x != y:
            return
        yield x


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed per round (default 64)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama.cpp's threads (default: every core)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        print(INSTALL if getattr(exc, "name", None) == "llama_cpp" else f"llama_cpp does not import: {exc}",
              file=sys.stderr)
        return 2
    from tinydecoder.checkpoint.smollm2 import smollm2_path, smollm2_tokenizer
    from tinydecoder.perf.bench_rows import bench_tokens
    from tinydecoder.perf.machine import cpu_description, keep_freed_memory

    keep_freed_memory()  # as bench and generate run
    ours = [Ours("q4_1"), Ours("f32")]
    impls = [LlamaCpp(str(smollm2_path()), args.threads, 1024)] + ours
    text = smollm2_tokenizer().encode(" ".join([ENGLISH] * 8))[:PROMPT_CONTEXT]
    result = compare(impls, lambda n: bench_tokens(ours[0].model, n), prompt=text, steps=args.steps,
                     rounds=args.rounds)
    if args.json:
        print(json.dumps({"machine": cpu_description(), "rounds": args.rounds, "results": result}, indent=1))
        return 0
    print(f"{cpu_description()}; medians of {args.rounds} alternating rounds")
    print("\n".join(table(result, impls[0].name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
