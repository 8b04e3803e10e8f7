"""`python -m tinydecoder serve` as a learner runs it: binds 127.0.0.1, answers, and exits 0
on SIGINT or SIGTERM, also with a stream in flight (its request is finished or cancelled)."""
import signal

import httpx
import pytest
from cli_server import start

pytest.importorskip("uvicorn")
pytestmark = pytest.mark.server
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_cli_server_answers_and_stops_cleanly_on_a_signal(sig):
    proc, url = start("--max-batch", "2", "--kv-blocks", "32")
    try:
        r = httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": "0 1 2 3", "max_tokens": 4,
                                                       "temperature": 0}, timeout=30)
        assert r.json()["choices"][0]["text"] == " 3 2 0 4"
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"model": "toy", "prompt": "0 1", "max_tokens": 60, "stream": True}) as s:
            lines = s.iter_lines()
            next(lines)
            proc.send_signal(sig)
            list(lines)  # the stream ends: finished or cancelled, not hung
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "serving 'toy' on http://127.0.0.1:" in out
    assert f"stopped on {sig.name}; KV blocks in use 0 of 32" in out
