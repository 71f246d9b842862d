"""edge-serve: an OpenAI-compatible local server with Prometheus metrics.

    pip install 'edge-runtime[serve]'
    edge-serve --bundle out/ --slots 4            # http://127.0.0.1:8080/v1, /metrics, /health

Modules: `app` (Starlette app, API key, request metrics, error bodies), `routes` (chat and completions,
JSON and SSE), `schemas` (request checks, response shapes), `scheduler` (the engine's worker thread and
bounded queue), `slots` (conversations kept per slot, prefix routing), `metrics` (prometheus-client),
`errors` (OpenAI's error object), `access` (one log line per request), `cli` (the console script), `process`
(edge-serve as a child process).

Why Starlette + uvicorn: both are small, pure-Python (uvicorn without its `[standard]` extras runs on h11),
long maintained by the Encode team, and install from wheels on every device we target (aarch64 Jetson, Pi)
without a compiler. Starlette gives routing, streaming responses with disconnect detection, and exception
handlers; uvicorn gives the HTTP/1.1 server with graceful SIGTERM (stop accepting, finish what is in flight
within a timeout). FastAPI would add pydantic and its compiled core for request validation that here is a
hundred lines of explicit checks whose errors name OpenAI's parameters. The engine work stays off the event
loop: one worker thread owns the engine (engines are not thread-safe), and tokens cross to asyncio with
`call_soon_threadsafe`.

Not imported by `edge_runtime` itself: devices that embed the Python API do not carry the server.
"""
