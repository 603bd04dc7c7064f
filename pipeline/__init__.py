"""Aqueduct's engine: pure and synchronous (no asyncio, Redis, actors or queue adapters).

The packages follow a step's path: request/ (the data a request carries) -> intake/ (prompt to
Request) -> scheduling/ (the plan) -> tensor_prep/ (plan to tensors) -> model/ (the forward) ->
sampling/ (logits to tokens) -> output/ (tokens to text); step/ holds the data passed between
them, loading/ and lora/ what the engine loads. `engine.LLMEngine` runs them in one loop; the
actors in actors/ run the same stages concurrently.

May import: nothing (pyproject.toml's contracts keep out actors/, queue_adapters/, asyncio and Redis).
"""
