"""The request and what it carries: `Request`/`Sequence` state, `SamplingParams` and their checks,
the checks on untrusted input, the engine's output records, beam-search state, image placeholders.

May import: nothing (plain data: no stage package, no torch).
"""
