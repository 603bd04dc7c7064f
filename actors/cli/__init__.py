"""The `aqueduct` command line (`main.entry_point`): batch, serve, worker, submit, bench, bench-redis,
loadtest; the engine flags shared by the commands, and logging set-up.

May import: actors.http, actors.worker, actors.kit, pipeline, queue_adapters. Nothing imports it.
"""
