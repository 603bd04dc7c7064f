"""The OpenAI-compatible HTTP gateway (`aqueduct serve`): FastAPI routes over a backend that is either
the worker's actor graph in this process (embedded) or a Redis deployment (stateless gateway).

May import: kit/, worker/ (the embedded backend runs the worker's graph), pipeline/, queue_adapters/.
Never cli/.
"""
