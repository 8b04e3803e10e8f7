"""`generate --trace FILE` and `serve --trace FILE`: write a Chrome trace-event JSON of every
request and engine step (serving.trace_events; open it in https://ui.perfetto.dev). The two
commands add the flag (`add_trace_argument`), run inside `open_trace(args)`, and hand the recorder
on with `trace_processors(args)` / `trace_options(args)`."""
from __future__ import annotations

import sys

REFUSED = (("beams", "--beams"), ("speculative", "--speculative"), ("tensor_parallel", "--tensor-parallel"))


def add_trace_argument(parser) -> None:
    """Add --trace FILE to a command's parser; the command runs inside `open_trace(args)`."""
    parser.add_argument("--trace", metavar="FILE",
                        help="write a Chrome trace-event JSON of every request and step to FILE "
                             "(open it in ui.perfetto.dev or chrome://tracing)")


class open_trace:
    """Context manager: sets args.trace_recorder (a TraceRecorder, or None without --trace) and
    saves the trace on the way out, however the command ended."""

    def __init__(self, args):
        self.args = args

    def __enter__(self):
        args, path = self.args, getattr(self.args, "trace", None)
        args.trace_recorder = args.trace_generate = None
        if path is None:
            return None
        for attr, flag in REFUSED:
            if getattr(args, attr, None) not in (None, False):
                raise ValueError(f"--trace records the engine's steps and one sequence's rounds; it does not "
                                 f"trace {flag}: drop one of them")
        from ..serving.trace_events import TraceRecorder

        args.trace_recorder = TraceRecorder(path)
        args.trace_recorder.save()  # fails now, not after the run, if FILE cannot be written
        return args.trace_recorder

    def __exit__(self, kind, exc, tb):
        recorder = self.args.trace_recorder
        if recorder is None:
            return False
        if self.args.trace_generate is not None:
            self.args.trace_generate.close("error" if kind is not None else "length")
        path = recorder.save()
        if kind is None:
            print(f"tinydecoder: trace written to {path} ({len(recorder.events)} events)", file=sys.stderr)
        return False


def trace_processors(args) -> list:
    """For `generate`: the logits processor that records its rounds (a one-element list), or []."""
    recorder = getattr(args, "trace_recorder", None)
    if recorder is None:
        return []
    from ..serving.trace_events import GenerateTrace

    args.trace_generate = GenerateTrace(recorder)
    return [args.trace_generate]


def trace_options(args) -> dict:
    """For `serve`: {"trace": recorder} for the engine loop, or {}."""
    recorder = getattr(args, "trace_recorder", None)
    return {} if recorder is None else {"trace": recorder}
