"""The OpenAI-compatible HTTP API (``--http-port``): the clients people already have, over the gRPC door's code.

routes.py (the Starlette app) → body.py and fields.py (the body into a ``GenerateRequest``) → the Generation
servicer, gate and telemetry of api/ → answers.py (OpenAI's shapes, SSE) and errors.py (OpenAI's error object);
tools.py (tool calls), context.py (an HTTP request as a gRPC call), server.py (uvicorn, TLS).
"""
