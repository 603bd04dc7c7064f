"""Scheduling: which sequences compute how many tokens in the next step (`Scheduler`), the paged KV
cache (`KVCacheManager`, `BlockPool`, prefix caching), planning a step ahead (`lookahead`), the stop
rules (`stop_checks`), the waiting order by priority and tenants' fair share (`waiting_queue`,
`fair_share`), tenants' seats and shares of a step (`tenant_shares`), LoRA adapters' admission and
slots (`adapter_gate`), requests ended here with an error (`failures`), grammar masks and beam
search's side. It produces a `StepPlan` and applies a
`StepResult`; speculation's part of a step is pipeline/speculative/'s `Speculator`.

May import: pipeline.request, pipeline.step, pipeline.config, pipeline.lora (registry and slots),
pipeline.grammar, pipeline.speculative (the speculator and its proposers, never the draft model).
"""
