"""The HTTP server (tinydecoder.server) driven by the official `openai` client, on the toy
model (the point here is the protocol): streaming and not, chat and completion, every error,
a disconnect that returns its blocks, preemption, and 16 concurrent greedy requests that equal
the same requests one at a time."""
import asyncio
import time

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

import tinydecoder as td  # noqa: E402
from tinydecoder.decoding.sampling import make_sampler  # noqa: E402
from tinydecoder.server import parse_metrics, start_server  # noqa: E402

pytestmark = pytest.mark.server
TOY = td.toy_model()


def ids_text(ids):
    return " ".join(map(str, ids))


def alone(prompt_ids, n):
    return "".join(f" {t}" for t in td.generate(TOY, list(prompt_ids), n).new_tokens)


def metrics(server) -> dict:
    return parse_metrics(httpx.get(server.url + "/metrics", timeout=10).text)


def wait_for(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def server():
    s = start_server("toy", max_batch=16, kv_blocks=128)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    c._server = server  # for tests that read its /metrics
    return c


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["toy"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok", "model": "toy"}


def test_completion_greedy_equals_generate(client):
    r = client.completions.create(model="toy", prompt="0 1 2 3", max_tokens=6, temperature=0)
    assert r.choices[0].text == alone([0, 1, 2, 3], 6)
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (4, 6, 10)


def test_streaming_completion_and_chat(client):
    pieces = [c.choices[0].text for c in client.completions.create(
        model="toy", prompt=[5, 4, 3], max_tokens=5, temperature=0, stream=True)]
    assert "".join(pieces) == alone([5, 4, 3], 5)
    chunks = list(client.chat.completions.create(
        model="toy", messages=[{"role": "user", "content": "0 1 2"}], max_tokens=4, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == alone([0, 1, 2], 4)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 4 and chunks[-1].usage.prompt_tokens == 3


def test_chat_non_streaming_and_stop_strings(client):
    r = client.chat.completions.create(model="toy", messages=[{"role": "system", "content": "0"},
                                                              {"role": "user", "content": "1 2"}],
                                       max_tokens=6, temperature=0)
    full = alone([0, 1, 2], 6)
    assert r.choices[0].message.content == full and r.choices[0].message.role == "assistant"
    stop = full.split()[2]  # the third generated id: the text ends before it
    r = client.completions.create(model="toy", prompt="0 1 2", max_tokens=6, temperature=0, stop=[f" {stop}"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[:full.index(f" {stop}")]
    server = client._server
    wait_for(lambda: metrics(server).get('tinydecoder_requests_total{finish_reason="stop"}', 0) >= 1)
    assert metrics(server).get('tinydecoder_requests_total{finish_reason="cancelled"}', 0) == 0


def test_seeded_sampling_and_processors(client):
    kw = dict(model="toy", prompt="0 1 2", max_tokens=8, temperature=1.0, top_p=0.9, seed=11)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    expect = td.generate(TOY, [0, 1, 2], 8, sampler=make_sampler(temperature=1.0, top_p=0.9, seed=11)).new_tokens
    assert a.choices[0].text == b.choices[0].text == ids_text([""] + expect)
    banned = client.completions.create(model="toy", prompt="0 1 2", max_tokens=5, temperature=0,
                                       logit_bias={str(t): -100 for t in range(5)})
    assert banned.choices[0].text == " 5" * 5
    rep = client.completions.create(model="toy", prompt="0 1 2", max_tokens=5, temperature=0,
                                    extra_body={"repetition_penalty": 3.0, "min_p": 0.05})
    from tinydecoder.decoding.processors import MinP, RepetitionPenalty
    expect = td.generate(TOY, [0, 1, 2], 5, processors=[RepetitionPenalty(3.0), MinP(0.05)]).new_tokens
    assert rep.choices[0].text == ids_text([""] + expect)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=-3), "max_tokens"),
    (dict(max_tokens="five"), "max_tokens: must be an integer"),
    (dict(temperature="hot"), "temperature: must be a number"),
    (dict(max_tokens=60), "exceed the model's context of 64"),
    (dict(prompt="0 1 99"), "token ids are 0..5"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop"),
])
def test_bad_fields_are_400_with_an_openai_error_body(client, kwargs, match):
    args = dict(model="toy", prompt="0 1 2 3 4 5 0 1", max_tokens=4) | kwargs
    with pytest.raises(openai.BadRequestError, match=match) as e:
        client.completions.create(**args)
    assert e.value.status_code == 400 and e.value.body["type"] == "invalid_request_error"


def test_malformed_json_and_a_body_over_the_limit_are_400(server, client):
    r = httpx.post(server.url + "/v1/completions", content=b'{"model": "toy", "prompt": ', timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="larger than the limit"):
        client.completions.create(model="toy", prompt="0 " * 600_000, max_tokens=1)


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="0 1", max_tokens=1)
    r = httpx.get(str(client.base_url) + "nowhere", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_an_api_key_is_required_when_set():
    with start_server("toy", api_key="sesame") as s:
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="toy", prompt="0 1", max_tokens=1)
        assert httpx.post(s.url + "/v1/completions", json={"model": "toy", "prompt": "0"}).status_code == 401
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sesame", max_retries=0)
        assert good.completions.create(model="toy", prompt="0 1", max_tokens=2, temperature=0).usage.completion_tokens == 2
        assert httpx.get(s.url + "/health").status_code == 200  # health and metrics stay open


def test_a_full_queue_is_503_with_retry_after_and_a_disconnect_returns_the_blocks():
    with start_server("toy", max_batch=1, max_waiting=1, kv_blocks=32, step_pause_s=0.05) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
        first = c.completions.create(model="toy", prompt="0 1 2 3 4", max_tokens=50, temperature=0, stream=True)
        it = iter(first)
        next(it)  # running now, holding blocks
        assert metrics(s)["tinydecoder_kv_blocks_used"] > 0
        second = httpx.Client(timeout=30)
        with second.stream("POST", s.url + "/v1/completions",
                           json={"model": "toy", "prompt": "3 3", "max_tokens": 3, "stream": True}):
            wait_for(lambda: metrics(s)["tinydecoder_requests_waiting"] == 1)
            with pytest.raises(openai.APIStatusError) as e:
                c.completions.create(model="toy", prompt="1", max_tokens=1)
            assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"
            first.close()  # the client goes away mid-stream
            wait_for(lambda: metrics(s).get('tinydecoder_requests_total{finish_reason="cancelled"}', 0) >= 1)
        second.close()
        wait_for(lambda: metrics(s)["tinydecoder_requests_running"] + metrics(s)["tinydecoder_requests_waiting"] == 0)
        m = metrics(s)
        assert m["tinydecoder_kv_blocks_used"] == 0 and m["tinydecoder_kv_blocks_free"] == 32
        assert s.engine.pool_stats().sequences == 0


def test_a_full_pool_preempts_and_greedy_texts_stay_as_alone():
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 6, size=8).tolist() for _ in range(4)]
    with start_server("toy", max_batch=4, kv_blocks=12) as s:  # 4 x 7 blocks wanted, 12 in the pool
        c = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)

        async def all_at_once():
            return await asyncio.gather(*[c.completions.create(model="toy", prompt=p, max_tokens=20, temperature=0)
                                          for p in prompts])
        out = asyncio.run(all_at_once())
        m = metrics(s)
        assert m["tinydecoder_preemptions_total"] >= 1
        assert [r.choices[0].text for r in out] == [alone(p, 20) for p in prompts]
        assert m["tinydecoder_kv_blocks_used"] == 0


def test_sixteen_concurrent_greedy_requests_equal_one_at_a_time(server, client):
    rng = np.random.default_rng(0)
    jobs = [(rng.integers(0, 6, size=int(rng.integers(2, 20))).tolist(), int(rng.integers(1, 30))) for _ in range(16)]
    one_by_one = [client.completions.create(model="toy", prompt=p, max_tokens=n, temperature=0).choices[0].text
                  for p, n in jobs]
    c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)

    async def together():
        async def one(p, n, i):
            if i % 2:  # half of them stream
                s = await c.completions.create(model="toy", prompt=p, max_tokens=n, temperature=0, stream=True)
                return "".join([ch.choices[0].text async for ch in s])
            return (await c.completions.create(model="toy", prompt=p, max_tokens=n, temperature=0)).choices[0].text
        return await asyncio.gather(*[one(p, n, i) for i, (p, n) in enumerate(jobs)])
    assert asyncio.run(together()) == one_by_one
    assert one_by_one[:3] == [alone(p, n) for p, n in jobs[:3]]
    m = metrics(server)
    assert m["tinydecoder_kv_blocks_used"] == 0 and m["tinydecoder_time_to_first_token_seconds_count"] >= 32


def test_the_load_test_tool_reports_no_leak_and_the_same_texts(capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "tools" / "load_test.py"
    spec = importlib.util.spec_from_file_location("load_test", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--model", "toy", "--clients", "4", "--requests", "8", "--max-tokens", "8",
                      "--kv-blocks", "12", "--json"]) == 0
    import json
    report = json.loads(capsys.readouterr().out)
    run = report["runs"][0]
    assert run["requests"] == 8 and run["completion_tokens"] == 64 and run["blocks_leaked"] == 0
    assert run["same_texts_as_baseline"] and run["ttft_p50_s"] <= run["ttft_p99_s"]
