"""The OpenAI-compatible HTTP API (``--http-port``): the clients people already have, over the call layer.

routes.py (the Starlette app: admission from the headers, the body, the call layer of api/) → body.py, fields.py,
structured.py and tools.py (the body into the call layer's request) → answers.py and sse.py (OpenAI's shapes,
server-sent events) and errors.py (OpenAI's error object); responses.py (the Responses API), server.py (uvicorn,
TLS). Nothing here speaks gRPC or protobuf.
"""
