"""Start `python -m tinydecoder serve` as a learner runs it, for the tests that need a real
process (signals, the trace written at shutdown): a free loopback port, this checkout's library;
and `answer_then_stop`, the run both kinds of test make of it."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

LIB = Path(__file__).resolve().parents[2] / "lib"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*args):
    """(process, url) of a toy-model server started with the extra CLI `args`, once it answers
    /health (60 s at most; a test failure with its output otherwise)."""
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


def answer_then_stop(sig, *args) -> tuple:
    """Start a toy server (extra CLI `args`), check one greedy completion, open a stream of 60
    tokens, send `sig` after its first chunk and read the stream to its end (finished or
    cancelled, not hung); -> (exit status, the server's output)."""
    proc, url = start(*args)
    try:
        r = httpx.post(url + "/v1/completions", json={"model": "toy", "prompt": "0 1 2 3", "max_tokens": 4,
                                                       "temperature": 0}, timeout=30)
        assert r.json()["choices"][0]["text"] == " 3 2 0 4"
        with httpx.stream("POST", url + "/v1/completions", timeout=30,
                          json={"model": "toy", "prompt": "0 1", "max_tokens": 60, "stream": True}) as s:
            lines = s.iter_lines()
            next(lines)
            proc.send_signal(sig)
            list(lines)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out

