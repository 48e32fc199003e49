"""Serving a model over HTTP: an OpenAI-compatible API (``attnlab serve``).

``engine.py`` batches concurrent requests continuously into one decoding loop over a shared
KV cache; ``app.py`` is the FastAPI application that speaks OpenAI's request and response
formats (and its server-sent events when streaming) on top of it.
"""
