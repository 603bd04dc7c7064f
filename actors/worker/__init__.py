"""The worker: the actor graph of docs/design.md §2 over the engine (intake, scheduler, the device
stages, output, control), its reply sinks, metrics and health endpoint, the wiring (`run`), and
recovery/ (liveness, ownership of request ids, crash resume).

May import: actors.kit, pipeline, queue_adapters. Never http/ or cli/.
"""
