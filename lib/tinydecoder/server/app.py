"""The HTTP side: a Starlette app with the OpenAI routes, /health and /metrics.

    POST /v1/completions        POST /v1/chat/completions   (stream: true -> server-sent events)
    GET  /v1/models             GET  /health                GET  /metrics (Prometheus text)

Handlers check the body (protocol.py), submit a Request to the engine loop (loop.py) and turn
its events into an OpenAI response or SSE chunks. A client that goes away has its request
cancelled (its KV blocks return between engine steps)."""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .loop import EngineLoop, QueueFullError
from .metrics import CONTENT_TYPE_LATEST
from .protocol import ApiError, chunk, new_id, parse_request, response, usage_chunk
from .text import TextOut

MAX_BODY_BYTES = 1 << 20
DISCONNECT_POLL_S = 0.25


def sse(obj) -> str:
    """One server-sent event: a `data:` line holding JSON, then a blank line."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def create_app(served, *, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               **engine_options) -> Starlette:
    """The app for `served` (a models.ServedModel). engine_options go to EngineLoop
    (kv_blocks, max_batch, token_budget, chunk_size, max_waiting). The engine thread starts and
    stops with the app's lifespan; `app.state.engine` is the EngineLoop."""
    engine = EngineLoop(served, **engine_options)

    def authorize(request: HttpRequest) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise ApiError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>'",
                           kind="authentication_error")

    async def read_json(request: HttpRequest):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            raise ApiError(400, f"the request body is larger than the limit of {max_body_bytes} bytes")
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > max_body_bytes:
                raise ApiError(400, f"the request body is larger than the limit of {max_body_bytes} bytes")
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None

    def submit(gen):
        try:
            return engine.submit(gen.request, asyncio.get_running_loop())
        except ValueError as e:  # it could never run: longer than the KV pool
            raise ApiError(400, str(e), "max_tokens") from None
        except QueueFullError as e:
            raise ApiError(503, f"the server is busy ({e}); retry later", kind="server_error",
                           headers={"Retry-After": "1"}) from None

    async def generate(request: HttpRequest, chat: bool):
        authorize(request)
        gen = parse_request(await read_json(request), served, chat)
        handle = submit(gen)
        rid, out = new_id(chat), TextOut(served.tokenizer, gen.stop)
        out.finish = None  # how the client's answer ended; counted by /metrics once it is sent
        if gen.stream:
            return StreamingResponse(stream(gen, handle, rid, out), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            while True:
                try:
                    event = await asyncio.wait_for(handle.events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)  # nobody reads it; finally cancels
                    continue
                out.feed(event.tokens)
                finish = "stop" if out.stopped else event.finish_reason
                if out.stopped:
                    engine.cancel(handle, "stop")
                if finish in ("cancelled", "error"):
                    raise ApiError(503, "the request was cancelled: the server is shutting down", kind="server_error",
                                   headers={"Retry-After": "1"})
                if finish:
                    out.finish = finish
                    return JSONResponse(response(gen, rid, served.name, out.text, finish, out.n_tokens))
        finally:
            ended(handle, out)

    async def stream(gen, handle, rid, out):
        try:
            if gen.chat:
                yield sse(chunk(gen, rid, served.name, None, None, first=True))
            while True:
                event = await handle.events.get()
                text = out.feed(event.tokens)
                finish = "stop" if out.stopped else event.finish_reason
                if out.stopped:
                    engine.cancel(handle, "stop")
                if finish in ("cancelled", "error"):
                    yield sse(ApiError(503, "the request was cancelled: the server is shutting down",
                                       kind="server_error").body())
                    return
                if finish:
                    text += out.rest()
                if text:
                    yield sse(chunk(gen, rid, served.name, text, None))
                if finish:
                    yield sse(chunk(gen, rid, served.name, None, finish))
                    if gen.include_usage:
                        yield sse(usage_chunk(gen, rid, served.name, out.n_tokens))
                    yield "data: [DONE]\n\n"
                    out.finish = finish
                    return
        finally:  # also when the client went away (the task is cancelled or the generator closed)
            ended(handle, out)

    def ended(handle, out) -> None:
        engine.cancel(handle)  # no-op when it finished in the engine
        engine.metrics.requests.labels(out.finish or "cancelled").inc()

    async def completions(request):
        return await generate(request, chat=False)

    async def chat_completions(request):
        return await generate(request, chat=True)

    async def models(request):
        authorize(request)
        return JSONResponse({"object": "list", "data": [
            {"id": served.name, "object": "model", "created": 0, "owned_by": "tinydecoder",
             "max_model_len": served.max_context}]})

    async def health(request):
        if not engine.alive:
            return JSONResponse({"status": "error", "engine": repr(engine.error)}, status_code=503)
        return JSONResponse({"status": "ok", "model": served.name})

    async def metrics(request):
        return Response(engine.metrics.text(), media_type=CONTENT_TYPE_LATEST)

    async def api_error(request, exc: ApiError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def http_error(request, exc: HTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(ApiError(exc.status_code, str(exc.detail), kind=kind).body(), status_code=exc.status_code)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], exception_handlers={ApiError: api_error, HTTPException: http_error}, lifespan=lifespan)
    app.state.engine, app.state.served = engine, served
    return app
