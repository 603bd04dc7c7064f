"""Nothing lost when a worker dies: liveness heartbeats, one owner per request id, the claimer that
takes over a dead worker's pending entries, and reading a reply stream to resume from it."""
