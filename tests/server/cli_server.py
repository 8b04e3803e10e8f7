"""Start `python -m tinydecoder serve` as a learner runs it, for the tests that need a real
process (signals, the trace written at shutdown): a free loopback port, this checkout's library."""
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
