"""serve --weights q4_1: the server on SmolLM2's Q4_1 blocks answers a greedy completion with the
float32 server's text."""
import json
import urllib.request

import pytest

pytest.importorskip("uvicorn")

from tinydecoder.fast.compiled import jit  # noqa: E402
from tinydecoder.server import start_server  # noqa: E402


@pytest.mark.smollm2
@pytest.mark.skipif(not jit.available(), reason="q4_1's kernels need numba")
def test_q4_1_server_gives_f32s_greedy_text():
    texts = {}
    for weights in ("q4_1", "f32"):
        server = start_server("smollm2", max_batch=4, kv_blocks=32, weights=weights)
        try:
            body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
            request = urllib.request.Request(f"{server.url}/v1/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            texts[weights] = json.load(urllib.request.urlopen(request, timeout=120))["choices"][0]["text"]
        finally:
            server.stop()
    assert texts["f32"] and texts["q4_1"] == texts["f32"]
