"""A notebook's prose cannot contradict its outputs: every measured-looking number a markdown cell
quotes (a decimal point, a x or ×, a %, or four or more digits) is printed by an output of the same
notebook, or set by its code (a constant, e.g. a prompt length), or is a citation or constant listed
below with its source. Numbers that only this machine gives belong in a printed sentence."""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9A][0-9]_*.ipynb"))  # chapters, appendices

# A number that looks measured: 12.5, 3×, 2.6x, 40%, 1,536, 49152 (four or more digits).
NUMBER = re.compile(r"(?<![\w.^_{\\])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d{4,})(?:\s*(%|×|x\b))?"
                    r"|(?<![\w.^_{\\])(\d+)\s*(%|×)")

# Citations and constants, each with where it comes from. Keyed by notebook number ("*": any).
ALLOWED = {
    "*": {
        "10000": "RoPE's base (Su et al., RoFormer, 2021), SmolLM2's rope_theta in SMOLLM2.md",
        "100000": "SmolLM2's rope_theta, from its config (../shared/reference/SMOLLM2.md)",
        "49152": "SmolLM2's vocabulary size (its config)",
        "1536": "SmolLM2's FFN width (its config)",
        "1,536": "SmolLM2's FFN width (its config)",
        "49,152": "SmolLM2's vocabulary size (its config)",
        "8192": "SmolLM2's context length (its config)",
        "2048": "SmolLM2's trained context / common powers of two in examples",
        "1e-5": "float32 rounding bound used by within_rounding",
        "0.5": "a half: a generic constant",
        "1.0": "one: a generic constant",
        "100%": "all of it",
    },
    "08": {"4521": "the walk-through's made-up id for \"Paris\" (../shared/seeds/003), quoted to be refuted"},
    "09": {"90": "top-p 0.9 written as a percentage of the probability mass"},
    "16": {"5120": "OPT-13B's width (Zhang et al., OPT, arXiv:2205.01068, Table 1), cited by the vLLM paper"},
}
YEARS = range(1990, 2036)  # publication years of the papers the notebooks cite


def cells(path):
    return json.loads(path.read_text())["cells"]


def output_text(nb_cells) -> str:
    parts = []
    for c in nb_cells:
        if c["cell_type"] != "code":
            continue
        for o in c.get("outputs", []):
            if "text" in o:
                parts.append("".join(o["text"]))
            for kind in ("text/plain", "text/html", "text/markdown", "text/latex"):
                if kind in o.get("data", {}):
                    parts.append("".join(o["data"][kind]))
    return "\n".join(parts)


def quoted_numbers(markdown: str) -> set:
    text = re.sub(r"\]\([^)]*\)", "]", markdown)  # link targets (arXiv ids, URLs)
    text = re.sub(r"arXiv:\s*\d{4}\.\d{4,5}", "", text)
    found = set()
    for m in NUMBER.finditer(text):
        number = m.group(1) or m.group(3)
        found.add(number)
    return found


def present(number: str, haystack: str) -> bool:
    """The number is printed as it is, or a printed number rounds to it (prose "5.6x" for 5.57x)."""
    plain = number.replace(",", "")
    if re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", haystack) or \
            re.search(rf"(?<![\d.]){re.escape(plain)}(?![\d])", haystack.replace(",", "")):
        return True
    if "." not in plain:
        return False
    places = len(plain.split(".")[1])
    printed = re.findall(r"(?<![\d.])\d+\.\d+", haystack.replace(",", ""))
    return any(len(p.split(".")[1]) > places and f"{float(p):.{places}f}" == plain for p in printed)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_prose_quotes_only_numbers_its_notebook_shows(path):
    nb = cells(path)
    outputs = output_text(nb)
    code = "\n".join("".join(c["source"]) for c in nb if c["cell_type"] == "code")
    allowed = ALLOWED["*"] | ALLOWED.get(path.name[:2], {})
    missing = []
    for i, c in enumerate(nb):
        if c["cell_type"] != "markdown":
            continue
        for number in sorted(quoted_numbers("".join(c["source"]))):
            if number in allowed or (number.isdigit() and int(number) in YEARS) or present(number, outputs) \
                    or present(number, code):
                continue
            missing.append(f"cell {i}: {number}")
    assert not missing, (f"{path.name}: prose quotes numbers no output prints (print them from the measurement, "
                         f"or allow them with their source): {missing}")


def test_the_check_finds_a_quoted_measurement():
    assert quoted_numbers("a pass costs 2.66× one step, 17 rows at 40% and 1,536 units") == {"2.66", "40", "1,536"}
    assert present("2.66", "cost 2.66x") and present("1,536", "1536 units") and present("5.6", "5.57x smaller")
    assert not present("2.66", "cost 2.67x") and not present("5.6", "5.5x") and not present("40", "400 rows")
