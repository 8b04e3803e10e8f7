"""Run the server: in the foreground (the CLI: uvicorn handles SIGINT/SIGTERM, finishes or
cancels what is in flight and returns), or on a background thread of this process (tests,
notebooks), started and stopped with bounded waits.

    server = start_server("toy", max_batch=4, kv_blocks=32)   # port 0: a free loopback port
    server.url        # "http://127.0.0.1:54321"
    server.engine     # the EngineLoop (its pool, its metrics)
    server.stop()     # graceful: in-flight requests finish or are cancelled
"""
from __future__ import annotations

import signal
import threading
import time

import uvicorn

from .app import create_app
from .models import served_model

GRACEFUL_S = 5  # uvicorn waits this long for open responses before cancelling them


def _config(app, host, port):
    return uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                          timeout_graceful_shutdown=GRACEFUL_S, access_log=False)


def run_server(model: str = "smollm2", *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
               weights: str | None = None, **engine_options) -> int:
    """Serve in the foreground until SIGINT or SIGTERM; returns 0 after a clean shutdown.
    weights: SmolLM2's "f32" or "q4_1" (None: checkpoint.registry's default)."""
    from ..checkpoint.registry import check_weights

    weights = check_weights(model, weights)
    served = served_model(model, weights)
    app = create_app(served, api_key=api_key, **engine_options)
    server = uvicorn.Server(_config(app, host, port))
    print(f"tinydecoder: serving {served.name!r} on http://{host}:{port}/v1 with {weights} weights (Ctrl-C to stop)",
          flush=True)
    received = []
    # uvicorn turns SIGINT/SIGTERM into a graceful shutdown, then re-raises the signal to the handler
    # that was there before; these record it, so the process ends with status 0 after a clean stop
    previous = {sig: signal.signal(sig, lambda s, frame: received.append(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    pool = app.state.engine.pool_stats()
    why = f" on {signal.Signals(received[0]).name}" if received else ""
    print(f"tinydecoder: stopped{why}; KV blocks in use {pool.blocks_used} of {pool.n_blocks}", flush=True)
    return 0


class BackgroundServer:
    """A uvicorn server on a daemon thread of this process."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self.app, self.host = app, host
        self._server = uvicorn.Server(_config(app, host, port))
        self._thread = threading.Thread(target=self._server.run, name="tinydecoder-http", daemon=True)

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread stopped while starting (is the port taken?)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the server did not start within {timeout} s")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def engine(self):
        return self.app.state.engine

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask it to shut down and wait (at most `timeout` s) until it has."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the server did not stop within {timeout} s")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_server(model: str = "toy", *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 timeout: float = 60.0, weights: str | None = None, **engine_options) -> BackgroundServer:
    """Start a server for `model` ("toy" or "smollm2"; weights: SmolLM2's "f32" or "q4_1") on a
    background thread; returns once it accepts connections (or raises after `timeout` s). port=0
    picks a free port."""
    app = create_app(served_model(model, weights), api_key=api_key, **engine_options)
    return BackgroundServer(app, host, port).start(timeout)
