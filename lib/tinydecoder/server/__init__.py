"""An OpenAI-compatible HTTP server in front of Part III's engine.

`python -m tinydecoder serve --model smollm2` runs it; `start_server("toy")` runs one on a
background thread (tests, notebook 21). The engine is serving.engine.Engine over a paged KV
pool (serving.backends.PagedKV, admission "on_demand": prefix reuse, chunked prefill,
preemption), driven by one thread (loop.py); the HTTP side is Starlette + uvicorn (app.py);
/metrics is prometheus-client (metrics.py). Nothing else in the package imports this one."""
from .app import create_app
from .background import BackgroundServer, run_server, start_server
from .loop import EngineLoop, QueueFullError
from .metrics import parse_metrics
from .models import MODEL_NAMES, served_model

__all__ = ["BackgroundServer", "EngineLoop", "MODEL_NAMES", "QueueFullError", "create_app", "parse_metrics",
           "run_server", "served_model", "start_server"]
