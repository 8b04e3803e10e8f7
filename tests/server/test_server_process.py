"""`python -m tinydecoder serve` as a learner runs it: binds 127.0.0.1, answers, and exits 0
on SIGINT or SIGTERM, also with a stream in flight (its request is finished or cancelled)."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn")
pytestmark = pytest.mark.server
LIB = Path(__file__).resolve().parents[2] / "lib"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*args):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{LIB}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, "-m", "tinydecoder", "serve", "--model", "toy", "--port", str(port), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the server did not start: {proc.communicate()[0]}")
        time.sleep(0.1)


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
