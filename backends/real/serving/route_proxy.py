"""`twinserve route`: an OpenAI-compatible proxy over N `twinserve serve` replicas.

The router is the very object the simulated cluster uses (twinserve.core.routing): the
proxy keeps one ReplicaLoad per replica (requests in flight counted here, KV usage read
from each replica's /metrics by the health loop) and asks the router for each request.
Prefix keys come from the request text in fixed-size byte chunks (the proxy has no
tokenizer); a session is the `X-Session-ID` header or the body's `user` field.

Streams pass through byte for byte; a client that disconnects closes the upstream
stream, and the replica aborts the request as it does for any client. A replica that
refuses connections or fails its health check leaves the rotation until /health answers
again; a request it was serving gets an OpenAI-shaped 502 (or, mid-stream, an error event).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import anyio
import httpx
import xxhash
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from twinserve.core.routing import (NoReplicaAvailableError, ReplicaLoad, RouteRequest, RouterConfig,
                                    prefix_keys_needed,
                                    text_prefix_keys)
from twinserve.backends.real.serving.errors import APIError
from twinserve.backends.real.serving.request_body import DEFAULT_MAX_BODY_BYTES, parse_json, read_body
from twinserve.backends.real.serving.route_metrics import ProxyMetrics, merge_replica_metrics

KV_USAGE = re.compile(rb"kv_cache_usage_perc(?:\{[^}]*\})?\s+([0-9.eE+-]+)")
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length",
               "content-encoding", "host"}


@dataclass(slots=True)
class ProxyConfig:
    """Replica URLs, the router and its options, health checking."""

    replicas: list[str]
    # The router and its own options (a prefix "block" is one chunk of prefix_chunk_chars here).
    router: RouterConfig = field(default_factory=RouterConfig)
    prefix_chunk_chars: int = 64
    health_interval_s: float = 1.0
    timeout_s: float = 600.0
    seed: int = 0
    # Bodies above this many bytes are refused with 413 before they are forwarded (as the server does).
    max_request_body_bytes: int = DEFAULT_MAX_BODY_BYTES


class _RelayResponse(StreamingResponse):
    """A pass-through stream that stops as soon as the client disconnects.

    The stream and a disconnect listener run side by side whatever ASGI version the server
    speaks (a server on ASGI 2.4 would otherwise notice only when a write fails), so a
    client that hangs up cancels the relay, which closes the upstream stream.
    """

    def __init__(self, content: Any, on_close: Any, **kw: Any) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def run_stream() -> None:
                    with contextlib.suppress(OSError):
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(run_stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()  # also when the stream never started


def _error(status: int, message: str, type_: str, code: str) -> JSONResponse:
    return JSONResponse(APIError(status, message, type_, None, code).body(), status_code=status)


# Keys never read past this many characters of a prompt (chunk_chars * max_blocks is far below it).
_MAX_KEY_CHARS = 1 << 16


def _prompt_text(body: dict[str, Any]) -> str:
    """The text a request's prefix is made of: the prompt, or a conversation's opening (the messages
    through the first user message, which every later turn of it repeats)."""
    if "messages" in body and isinstance(body["messages"], list):
        parts = []
        for m in body["messages"]:
            if isinstance(m, dict):
                content = m.get("content")
                if isinstance(content, list):  # content parts
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                parts.append(f"<{m.get('role', '')}>{str(content or '')[:_MAX_KEY_CHARS]}")
                if m.get("role") == "user":
                    break
        return "".join(parts)
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):  # token ids: their leading ones name the prefix (never dump them all)
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else json.dumps(prompt[:_MAX_KEY_CHARS])
    return prompt[:_MAX_KEY_CHARS] if isinstance(prompt, str) else ""


def _as_object(body: Any) -> dict[str, Any]:
    return body if isinstance(body, dict) else {}


async def _routing_body(raw: bytes) -> dict[str, Any]:
    """The JSON body as far as routing needs it, read by the server's own parser (its checks, and off the
    loop when large); {} when it is not a JSON object: the replica answers that request's 400 itself."""
    try:
        return await parse_json(raw, _as_object)
    except APIError:
        return {}


def _affinity_keys(body: dict[str, Any], chunk_chars: int, max_blocks: int) -> tuple[int, ...]:
    """Prefix keys of a request; a conversation's opening shorter than max_blocks chunks is keyed by its
    partial last chunk too, so its later turns (which extend the text) keep the same deepest key."""
    text = _prompt_text(body)[:chunk_chars * max_blocks]  # no byte past these characters is keyed
    keys = text_prefix_keys(text, chunk_chars, max_blocks)
    if "messages" in body and len(keys) < max_blocks:
        data = text.encode("utf-8", "surrogatepass")[:chunk_chars * max_blocks]
        rest = data[len(keys) * chunk_chars:]
        if rest:
            keys += (xxhash.xxh3_64_intdigest(rest, keys[-1] if keys else 0),)
    return keys


class RouteProxy:
    """The proxy's state: replicas, their loads, the router, an HTTP client, metrics."""

    def __init__(self, cfg: ProxyConfig) -> None:
        if not cfg.replicas:
            raise ValueError("route needs at least one --replica URL")
        self.cfg = cfg
        self.urls = [u.rstrip("/") for u in cfg.replicas]
        self.loads = [ReplicaLoad(i) for i in range(len(self.urls))]
        self.router = cfg.router.build(cfg.seed)
        # The body matters to routing only for prefix keys and a session named by `user`.
        self._reads_body = self.router.needs_prefix_keys or self.router.name == "session_affinity"
        self.metrics = ProxyMetrics()
        for u in self.urls:
            self.metrics.healthy.labels(u).set(1)
        self.client: httpx.AsyncClient | None = None
        self._health_task: asyncio.Task | None = None

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Open the upstream client and start the health loop."""
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(self.cfg.timeout_s, connect=5.0),
                                        limits=httpx.Limits(max_connections=1024))
        self._health_task = asyncio.create_task(self._health_loop())

    async def stop(self) -> None:
        """Stop the health loop and close connections."""
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self.client is not None:
            await self.client.aclose()

    def set_health(self, i: int, ok: bool) -> None:
        """Put a replica in or out of rotation."""
        self.loads[i].healthy = ok
        self.metrics.healthy.labels(self.urls[i]).set(1 if ok else 0)

    async def check(self, i: int) -> None:
        """One health check: /health must answer 200; KV usage is read from /metrics."""
        assert self.client is not None
        url = self.urls[i]
        try:
            r = await self.client.get(url + "/health", timeout=2.0)
            ok = r.status_code == 200
            if ok:
                m = await self.client.get(url + "/metrics", timeout=2.0)
                hit = KV_USAGE.search(m.content)
                if hit:
                    self.loads[i].kv_usage = float(hit.group(1))
        except httpx.HTTPError:
            ok = False
        self.set_health(i, ok)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.check(i) for i in range(len(self.urls))))
            await asyncio.sleep(self.cfg.health_interval_s)

    # ---------------------------------------------------------------- routing
    def choose(self, body: dict[str, Any], headers: Any, exclude: set[int]) -> int:
        """The replica for this request (NoReplicaAvailableError when none is in rotation)."""
        keys: tuple[int, ...] = ()
        if self.router.needs_prefix_keys:
            keys = _affinity_keys(body, self.cfg.prefix_chunk_chars, prefix_keys_needed(self.router))
        session = headers.get("x-session-id") or body.get("user")
        views = [ReplicaLoad(x.index, x.outstanding, x.kv_usage,
                             x.healthy and x.index not in exclude, x.routed)
                 for x in self.loads] if exclude else self.loads
        return self.router.choose(RouteRequest("", keys, str(session) if session else None),
                                  views)

    def _begin(self, i: int) -> None:
        load = self.loads[i]
        load.outstanding += 1
        load.routed += 1
        self.metrics.routed.labels(self.urls[i], self.cfg.router.router).inc()
        self.metrics.in_flight.labels(self.urls[i]).inc()

    def _end(self, i: int) -> None:
        self.loads[i].outstanding -= 1
        self.metrics.in_flight.labels(self.urls[i]).dec()

    def _replica_failed(self, i: int, exc: Exception) -> str:
        self.set_health(i, False)
        self.metrics.errors.labels(self.urls[i]).inc()
        return (f"replica {self.urls[i]} failed ({type(exc).__name__}: {exc}); it is out of "
                "rotation until its /health answers again; retry the request")

    async def forward(self, request: Request, path: str) -> Response:
        """Route one OpenAI request and pass the answer (or the stream) through."""
        assert self.client is not None
        try:
            raw = await read_body(request, self.cfg.max_request_body_bytes)
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status)
        body: dict[str, Any] = {}
        if self._reads_body:  # round robin and least loaded never look inside: no parse at all
            # Large bodies are parsed on a worker thread: the loop keeps relaying every other stream.
            body = await _routing_body(raw)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        tried: set[int] = set()
        while True:
            try:
                i = self.choose(body, request.headers, tried)
            except NoReplicaAvailableError as e:
                self.metrics.refused.inc()
                return _error(503, str(e), "service_unavailable_error", "no_replica_available")
            self._begin(i)
            upstream = self.client.build_request("POST", self.urls[i] + path, content=raw,
                                                 headers=headers)
            try:
                resp = await self.client.send(upstream, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                # Nothing reached the replica: take it out and try another one.
                self._end(i)
                self._replica_failed(i, e)
                tried.add(i)
                continue
            except httpx.HTTPError as e:
                self._end(i)
                return _error(502, self._replica_failed(i, e), "bad_gateway_error",
                              "replica_unavailable")
            break
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        out_headers["x-twinserve-replica"] = str(i)
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            done = _Once(self, i, resp)
            return _RelayResponse(self._relay(i, resp, done), done.close,
                                  status_code=resp.status_code,
                                     headers=out_headers, media_type="text/event-stream")
        try:
            content = await resp.aread()
        except httpx.HTTPError as e:
            return _error(502, self._replica_failed(i, e), "bad_gateway_error",
                          "replica_unavailable")
        finally:
            await resp.aclose()
            self._end(i)
        return Response(content, status_code=resp.status_code, headers=out_headers)

    async def _relay(self, i: int, resp: httpx.Response, done: "_Once") -> AsyncIterator[bytes]:
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as e:
            err = APIError(502, self._replica_failed(i, e), "bad_gateway_error", None,
                           "replica_unavailable").body()
            yield f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
        finally:
            # Runs on normal end, on error, and when the client goes away (the response
            # task is cancelled): closing the upstream stream makes the replica abort.
            # Shielded: inside a cancelled scope every await would be cancelled at once.
            with anyio.CancelScope(shield=True):
                await done.close()

    async def passthrough_get(self, path: str) -> Response:
        """A GET answered by the first replica in rotation (e.g. /v1/models)."""
        return await self.passthrough("GET", path)

    async def passthrough(self, method: str, path: str, request: Request | None = None) -> Response:
        """A request answered by the least busy replica in rotation, unrouted (/tokenize, /version, /ping...)."""
        assert self.client is not None
        content = None
        if request is not None:
            try:
                content = await read_body(request, self.cfg.max_request_body_bytes)
            except APIError as e:
                return JSONResponse(e.body(), status_code=e.status)
        headers = ({k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
                   if request is not None else None)
        order = sorted((x for x in self.loads if x.healthy), key=lambda x: (x.outstanding, x.index))
        for load in order:
            i = load.index
            try:
                r = await self.client.request(method, self.urls[i] + path, content=content, headers=headers,
                                              timeout=60.0)
            except httpx.HTTPError as e:
                self._replica_failed(i, e)
                continue
            return Response(r.content, status_code=r.status_code,
                            media_type=r.headers.get("content-type"))
        return _error(503, str(NoReplicaAvailableError(len(self.loads))),
                      "service_unavailable_error", "no_replica_available")

    async def replica_metrics(self) -> bytes:
        """Every replica's /metrics series with a `replica` label (the URL), families merged across replicas."""
        assert self.client is not None

        async def fetch(i: int) -> str | None:
            try:
                r = await self.client.get(self.urls[i] + "/metrics", timeout=2.0)
            except httpx.HTTPError:
                return None
            return r.text if r.status_code == 200 else None

        texts = await asyncio.gather(*(fetch(i) for i, x in enumerate(self.loads) if x.healthy))
        urls = [u for u, x in zip(self.urls, self.loads) if x.healthy]
        return merge_replica_metrics([(u, t) for u, t in zip(urls, texts) if t is not None])


class _Once:
    """Closes one upstream response and ends its in-flight count exactly once."""

    def __init__(self, proxy: RouteProxy, i: int, resp: httpx.Response) -> None:
        self.proxy, self.i, self.resp = proxy, i, resp
        self.closed = False

    async def close(self) -> None:
        """Idempotent: the relay's finally and the response's finally both call it."""
        if self.closed:
            return
        self.closed = True
        self.proxy._end(self.i)
        await self.resp.aclose()


def build_proxy_app(cfg: ProxyConfig) -> FastAPI:
    """The FastAPI app of the proxy (its RouteProxy is app.state.proxy)."""
    proxy = RouteProxy(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await proxy.start()
        try:
            yield
        finally:
            await proxy.stop()

    app = FastAPI(title="twinserve route", lifespan=lifespan)
    app.state.proxy = proxy

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy.forward(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await proxy.forward(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models() -> Response:
        return await proxy.passthrough_get("/v1/models")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        return await proxy.passthrough("POST", "/tokenize", request)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        return await proxy.passthrough("POST", "/detokenize", request)

    @app.get("/version")
    async def version() -> Response:
        return await proxy.passthrough_get("/version")

    async def ping(request: Request) -> Response:
        return await proxy.passthrough(request.method, "/ping")

    app.add_api_route("/ping", ping, methods=["GET"], operation_id="ping_get")
    app.add_api_route("/ping", ping, methods=["POST"], operation_id="ping_post")

    @app.get("/health")
    async def health() -> Response:
        up = sum(1 for x in proxy.loads if x.healthy)
        return JSONResponse({"replicas": len(proxy.loads), "healthy": up},
                            status_code=200 if up else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        # The router's own series, then each replica's labelled by replica (one scrape sees the fleet).
        own = generate_latest(proxy.metrics.registry)
        return Response(own + await proxy.replica_metrics(), media_type=CONTENT_TYPE_LATEST)

    return app


def run_proxy(cfg: ProxyConfig, host: str, port: int, log_level: str = "info") -> int:
    """Serve the proxy until interrupted."""
    import uvicorn

    uvicorn.run(build_proxy_app(cfg), host=host, port=port, log_level=log_level,
                access_log=False)
    return 0
