"""Multi-LoRA: PEFT adapter files (adapter.py), the worker's hashed private copy of each validated
adapter (private_copy.py), the name -> adapter registry with its host-memory LRU (registry.py) and
the scheduler's device-slot assignment (slots.py). Device tensors live in pipeline/model/lora.py.

May import: pipeline.request.
"""
