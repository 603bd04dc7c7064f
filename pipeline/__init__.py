"""Aqueduct engine: pure, synchronous; no asyncio, no Redis."""
