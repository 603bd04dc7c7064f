"""Scheduling: which sequences compute how many tokens in the next step (`Scheduler`), the paged KV
cache (`KVCacheManager`, `BlockPool`, prefix caching), planning a step ahead, beam search's side.

Produces a `StepPlan` (step/) and applies a `StepResult` (step/). May import: request/, step/,
lora/ (registry and slots), config.
"""
