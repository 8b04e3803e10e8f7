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


class Api:
    """The route handlers, over one engine loop and the model it serves."""

    def __init__(self, served, engine: EngineLoop, api_key: str | None, max_body_bytes: int):
        self.served, self.engine, self.api_key, self.max_body_bytes = served, engine, api_key, max_body_bytes

    # ------------------------------------------------------------- checks
    def authorize(self, request: HttpRequest) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise ApiError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>'",
                           kind="authentication_error")

    async def read_json(self, request: HttpRequest):
        limit = self.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise ApiError(400, f"the request body is larger than the limit of {limit} bytes")
        body = b""
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise ApiError(400, f"the request body is larger than the limit of {limit} bytes")
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None

    def submit(self, gen):
        try:
            return self.engine.submit(gen.request, asyncio.get_running_loop())
        except ValueError as e:  # it could never run: longer than the KV pool
            raise ApiError(400, str(e), "max_tokens") from None
        except QueueFullError as e:
            raise ApiError(503, f"the server is busy ({e}); retry later", kind="server_error",
                           headers={"Retry-After": "1"}) from None

    # ------------------------------------------------------------- one request
    async def generate(self, request: HttpRequest, chat: bool):
        self.authorize(request)
        gen = parse_request(await self.read_json(request), self.served, chat)
        handle = self.submit(gen)
        rid, out = new_id(chat), TextOut(self.served.tokenizer, gen.stop)
        out.finish = None  # how the client's answer ended; counted by /metrics once it is sent
        if gen.stream:
            return StreamingResponse(self.stream(gen, handle, rid, out), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self.answer(request, gen, handle, rid, out)

    def take(self, handle, out, event) -> tuple:
        """One engine event -> (text that may be sent now, finish reason or None). A stop string
        ends the request in the engine; a cancelled or failed one raises ApiError(503)."""
        text = out.feed(event.tokens)
        finish = "stop" if out.stopped else event.finish_reason
        if out.stopped:
            self.engine.cancel(handle, "stop")
        if finish in ("cancelled", "error"):
            raise ApiError(503, "the request was cancelled: the server is shutting down", kind="server_error",
                           headers={"Retry-After": "1"})
        return text, finish

    async def answer(self, request: HttpRequest, gen, handle, rid, out):
        """The whole reply as one JSON response (499 and cancelled if the client went away)."""
        try:
            while True:
                try:
                    event = await asyncio.wait_for(handle.events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)  # nobody reads it; finally cancels
                    continue
                _, finish = self.take(handle, out, event)
                if finish:
                    out.finish = finish
                    return JSONResponse(response(gen, rid, self.served.name, out.text, finish, out.n_tokens))
        finally:
            self.ended(handle, out)

    async def stream(self, gen, handle, rid, out):
        """The reply as server-sent events: a chunk per piece of text, the finish, usage, [DONE]."""
        name = self.served.name
        try:
            if gen.chat:
                yield sse(chunk(gen, rid, name, None, None, first=True))
            finish = None
            while not finish:
                try:
                    text, finish = self.take(handle, out, await handle.events.get())
                except ApiError as e:
                    yield sse(e.body())
                    return
                text += out.rest() if finish else ""
                if text:
                    yield sse(chunk(gen, rid, name, text, None))
            yield sse(chunk(gen, rid, name, None, finish))
            if gen.include_usage:
                yield sse(usage_chunk(gen, rid, name, out.n_tokens))
            yield "data: [DONE]\n\n"
            out.finish = finish
        finally:  # also when the client went away (the task is cancelled or the generator closed)
            self.ended(handle, out)

    def ended(self, handle, out) -> None:
        self.engine.cancel(handle)  # no-op when it finished in the engine
        self.engine.metrics.requests.labels(out.finish or "cancelled").inc()

    # ------------------------------------------------------------- routes
    async def completions(self, request):
        return await self.generate(request, chat=False)

    async def chat_completions(self, request):
        return await self.generate(request, chat=True)

    async def models(self, request):
        self.authorize(request)
        return JSONResponse({"object": "list", "data": [
            {"id": self.served.name, "object": "model", "created": 0, "owned_by": "tinydecoder",
             "max_model_len": self.served.max_context}]})

    async def health(self, request):
        if not self.engine.alive:
            return JSONResponse({"status": "error", "engine": repr(self.engine.error)}, status_code=503)
        return JSONResponse({"status": "ok", "model": self.served.name})

    async def metrics(self, request):
        return Response(self.engine.metrics.text(), media_type=CONTENT_TYPE_LATEST)


async def api_error(request, exc: ApiError):
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def http_error(request, exc: HTTPException):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(ApiError(exc.status_code, str(exc.detail), kind=kind).body(), status_code=exc.status_code)


def create_app(served, *, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               **engine_options) -> Starlette:
    """The app for `served` (a models.ServedModel). engine_options go to EngineLoop
    (kv_blocks, max_batch, token_budget, chunk_size, max_waiting). The engine thread starts and
    stops with the app's lifespan; `app.state.engine` is the EngineLoop."""
    engine = EngineLoop(served, **engine_options)
    api = Api(served, engine, api_key, max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = Starlette(routes=[
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
    ], exception_handlers={ApiError: api_error, HTTPException: http_error}, lifespan=lifespan)
    app.state.engine, app.state.served = engine, served
    return app
