"""Online serving: the async engine, the OpenAI-compatible HTTP server, metrics and the bench client.

Heavy imports (fastapi, uvicorn, torch) happen in the submodules, not here.
"""
