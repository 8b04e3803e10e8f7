"""`python -m tinydecoder serve` as a learner runs it: binds 127.0.0.1, answers, and exits 0
on SIGINT or SIGTERM, also with a stream in flight (its request is finished or cancelled)."""
import signal

import pytest
from cli_server import answer_then_stop

pytest.importorskip("uvicorn")
pytestmark = pytest.mark.server
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_cli_server_answers_and_stops_cleanly_on_a_signal(sig):
    code, out = answer_then_stop(sig, "--max-batch", "2", "--kv-blocks", "32")
    assert code == 0, out
    assert "serving 'toy' on http://127.0.0.1:" in out and "/v1 with f32 weights (Ctrl-C to stop)" in out
    assert f"stopped on {sig.name}; KV blocks in use 0 of 32" in out
