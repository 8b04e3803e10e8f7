"""`serve --trace` and `generate --trace`: a Chrome trace of every request (serving/trace_events.py)
from the HTTP server under concurrent requests (one preempted), from the CLI server stopped by
Ctrl-C, and from `generate`."""
import asyncio
import json
import signal

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from cli_server import answer_then_stop  # noqa: E402

import tinydecoder as td  # noqa: E402
from tinydecoder.cli import main  # noqa: E402
from tinydecoder.server import parse_metrics, start_server  # noqa: E402
from tinydecoder.serving.trace_events import REQUESTS_PID, TraceRecorder, load_trace  # noqa: E402

pytestmark = pytest.mark.server
TOY = td.toy_model()


def tracks(events) -> dict:
    out = {}
    for e in events:
        if e["ph"] != "M" and e["pid"] == REQUESTS_PID:
            out.setdefault(e["tid"], []).append(e)
    return out


def chosen_text(evs) -> str:
    return "".join(f" {e['args']['token']}" for e in evs if e["name"] in ("prefill", "decode") and "token" in e["args"])


def test_a_served_trace_has_every_request_its_decode_steps_and_a_preemption(tmp_path):
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 6, size=8).tolist() for _ in range(4)]
    trace = TraceRecorder(tmp_path / "serve.json")
    with start_server("toy", max_batch=4, kv_blocks=12, trace=trace) as s:  # 4 x 7 blocks wanted, 12 in the pool
        c = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)

        async def all_at_once():
            return await asyncio.gather(*[c.completions.create(model="toy", prompt=p, max_tokens=20, temperature=0)
                                          for p in prompts])
        out = asyncio.run(all_at_once())
        preemptions = parse_metrics(httpx.get(s.url + "/metrics", timeout=10).text)["tinydecoder_preemptions_total"]
    assert preemptions >= 1
    events = load_trace(tmp_path / "serve.json")  # written when the server stopped
    by = tracks(events)
    assert len(by) == len(prompts)
    assert sorted(chosen_text(evs) for evs in by.values()) == sorted(r.choices[0].text for r in out)
    traced_preemptions = 0
    for evs in by.values():
        (finish,) = [e for e in evs if e["name"] == "finish"]
        assert finish["args"]["finish_reason"] == "length" and finish["args"]["generated_tokens"] == 20
        p = finish["args"]["preemptions"]
        traced_preemptions += p
        assert sum(e["name"] == "decode" for e in evs) == 20 - 1 - p
        assert sum(e["name"] == "preempted" for e in evs) == p
        assert sum(e["name"] == "queued" for e in evs) == 1 + p
        spans = sorted((e for e in evs if e["name"] in ("queued", "prefill", "decode")), key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-6 for a, b in zip(spans, spans[1:]))  # 3-decimal us, added
    assert traced_preemptions == preemptions
    timed = [e["ts"] for e in events if e["ph"] != "M"]
    assert timed == sorted(timed)


def test_serve_trace_is_valid_json_after_ctrl_c(tmp_path):
    path = tmp_path / "cli.json"
    code, out = answer_then_stop(signal.SIGINT, "--max-batch", "2", "--kv-blocks", "32", "--trace", str(path))
    assert code == 0, out
    by = tracks(load_trace(path))
    assert chosen_text(by[1]) == " 3 2 0 4"
    reasons = [e["args"]["finish_reason"] for evs in by.values() for e in evs if e["name"] == "finish"]
    assert reasons[0] == "length" and reasons[1] in ("length", "cancelled")


def test_generate_trace_writes_one_round_per_token(tmp_path, capsys):
    path = tmp_path / "gen.json"
    assert main(["generate", "--model", "toy", "--prompt", "0 1 2 3", "--max-new-tokens", "5", "--json",
                 "--trace", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)  # stdout stays one JSON object
    events = load_trace(path)
    work = [e for e in events if e["name"] in ("prefill", "decode")]
    assert [e["name"] for e in work] == ["prefill"] + ["decode"] * 4
    assert [e["args"]["token"] for e in work] == out["token_ids"] == td.generate(TOY, [0, 1, 2, 3], 5).new_tokens
    assert [e["args"]["finish_reason"] for e in events if e["name"] == "finish"] == ["length"]


def test_generate_trace_refuses_beams(tmp_path, capsys):
    assert main(["generate", "--model", "toy", "--prompt", "0 1", "--beams", "2", "--trace", str(tmp_path / "b.json")]) == 2
    assert "--beams" in capsys.readouterr().err
