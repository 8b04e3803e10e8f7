"""The server on the real model: SmolLM2-135M-Instruct's chat template, its end-of-turn token,
streaming text decoded across token boundaries, and concurrent greedy requests equal to the
same requests one at a time (and to td.generate). Kept to a few tokens: each step of the real
model takes a noticeable time on a busy CPU."""
import asyncio

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

import tinydecoder as td  # noqa: E402
from tinydecoder.server import start_server  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.smollm2]
QUESTIONS = ["What is the capital of France?", "Name a colour."]


@pytest.fixture(scope="module")
def server():
    s = start_server("smollm2", max_batch=4, kv_blocks=32)
    yield s
    s.stop()


def test_chat_uses_the_template_and_concurrent_greedy_equals_alone(server):
    tok, model = td.smollm2_tokenizer(), td.load_smollm2()
    expected = []
    for q in QUESTIONS:
        ids = tok.encode_chat([{"role": "user", "content": q}])
        new = td.generate(model, ids, 6, stop_tokens=[tok.eos_id]).new_tokens
        expected.append((tok.decode([t for t in new if t != tok.eos_id]), len(ids), len(new)))
    c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)

    async def ask(q, stream):
        kw = dict(model="smollm2", messages=[{"role": "user", "content": q}], max_tokens=6, temperature=0)
        if not stream:
            r = await c.chat.completions.create(**kw)
            return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.completion_tokens
        s = await c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
        chunks = [ch async for ch in s]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        return text, chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens

    async def together():
        return await asyncio.gather(ask(QUESTIONS[0], False), ask(QUESTIONS[1], True))
    assert asyncio.run(together()) == expected
    assert "Paris" in expected[0][0]
    assert server.engine.pool_stats().blocks_used == 0
