"""`inferdesk serve`: an OpenAI-compatible HTTP server (FastAPI on uvicorn) over a loaded
causal model and/or encoder, with continuous batching of concurrent chat requests."""
