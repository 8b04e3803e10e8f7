"""tools/compare_llama_cpp.py's harness (llama_cpp itself is optional and not installed here): without
it the tool says how to install it; with stand-ins, medians, ratios and greedy agreement are what the
timings and tokens give."""
import importlib.util
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "compare_llama_cpp.py"
spec = importlib.util.spec_from_file_location("compare_llama_cpp", TOOL)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


class StandIn:
    """Times and tokens given in advance, one per call, in order."""

    def __init__(self, name, prefills, decodes, tokens):
        self.name, self.prefills, self.decodes, self.tokens = name, list(prefills), list(decodes), tokens

    def prefill(self, ids):
        return self.prefills.pop(0)

    def decode(self, prompt, steps):
        return self.decodes.pop(0), self.tokens


def test_without_llama_cpp_it_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import raises ImportError
    assert tool.main([]) == 2
    err = capsys.readouterr().err
    assert "pip install llama-cpp-python" in err and "not a dependency" in err


def test_medians_ratios_and_agreement():
    # two rounds x one prefill length: the median of [1.0, 3.0] is 2.0; decode 64 steps in 0.5 s and
    # 1.5 s -> 128 and ~42.7 tok/s, median 85.3
    base = StandIn("llama.cpp", [2.0, 2.0], [0.5, 0.5], [5, 6, 7, 8])
    ours = StandIn("ours", [1.0, 3.0], [0.25, 0.75], [5, 6, 9, 8])
    result = tool.compare([base, ours], lambda n: list(range(n)), prompt=[1, 2], lengths=(100,), steps=64, rounds=2)
    assert result["llama.cpp"]["prefill_seconds"] == {"100": 2.0}
    assert result["ours"]["prefill_seconds"] == {"100": 2.0}
    assert result["llama.cpp"]["decode_tokens_per_second"] == 128.0
    assert abs(result["ours"]["decode_tokens_per_second"] - (256 + 64 / 0.75) / 2) < 1e-9
    lines = tool.table(result, "llama.cpp")
    assert "prefill 100: 2.000 s (1.00x)" in lines[1]
    assert f"({result['ours']['decode_tokens_per_second'] / 128:.2f}x)" in lines[1]
    assert "first 2 of 4" in lines[1] and "first 4 of 4" in lines[0]
