"""The OpenAI-compatible HTTP gateway (`aqueduct serve`): FastAPI routes over a backend that is either
the worker's actor graph in this process (embedded) or a Redis deployment (stateless gateway)."""
