"""Queues between processes and actors: the in-memory and Redis Streams adapters behind one
interface (`base`, `memory`, `redis_streams`), the msgpack wire codec for requests and replies
(`codec`, `chat_message`, `wire_images`, `data_uri`, `wire_limits`), the priority lanes and prefix
placement over them (`priority_lanes`, `placement`, `stealing`), and the client that submits and
reads replies.

May import: pipeline.request (the checks a wire entry's fields share with the engine),
pipeline.scheduling.prefix_keys (a prompt's blocks named as the workers name them).
"""
