"""`python -m tinydecoder serve`: a model over an OpenAI-compatible HTTP API (tinydecoder.server)
until SIGINT/SIGTERM."""
from __future__ import annotations

from .args import add_model_argument, add_weights_argument, int_arg, positive_int_arg
from .trace import add_trace_argument, open_trace, trace_options


def add_parser(subparsers) -> None:
    serve = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API "
                                  "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)")
    add_model_argument(serve, "smollm2", "smollm2 (default) or toy")
    add_weights_argument(serve, "serve")  # --weights f32|q4_1
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int_arg, default=8000, help="port (default 8000)")
    serve.add_argument("--max-batch", type=positive_int_arg, default=16, help="most requests running at once (16)")
    serve.add_argument("--kv-blocks", type=positive_int_arg, default=256, help="KV blocks in the paged pool (256)")
    serve.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1/*")
    add_trace_argument(serve)  # --trace FILE: every request and engine step, written at shutdown


def run(args) -> int:
    try:
        from ..server import run_server
    except ImportError as exc:
        raise ValueError(f"the server needs the serve extra (pip install -e '.[serve]'): {exc}") from None
    from ..checkpoint.registry import check_weights, serve_weights

    weights = check_weights(args.model, args.weights, serve_weights(args.max_batch))  # a clear error before anything loads
    with open_trace(args):
        return run_server(args.model, weights=weights, host=args.host, port=args.port, api_key=args.api_key,
                          max_batch=args.max_batch, kv_blocks=args.kv_blocks, **trace_options(args))
