"""Nothing lost when a worker dies: liveness heartbeats, one owner per request id, the claimer that
takes over a dead worker's pending entries, and reading a reply stream to resume from it.

May import: actors.worker.admission (freeing a resumed request's slot), pipeline.request,
queue_adapters.
"""
