"""Asyncio actors over the pipeline: the actor kit (kit/), the worker's graph (worker/), the HTTP
gateway (http/) and the `aqueduct` command (cli/), each over the next (pyproject.toml's contracts).

May import: pipeline, queue_adapters.
"""
