"""The actor kit: what every actor graph is built from, whatever it runs. An actor (`base`), the
runtime that runs and supervises a graph (`runtime`), the streams between actors and their message
types and encoding (`edges`, `messages`, `message_codec`), the device thread and engine loading
(`device`), the event loop and process tuning every `aqueduct` process starts with.

May import: pipeline, queue_adapters. Never worker/, http/ or cli/.
"""
