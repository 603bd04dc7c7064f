"""Output: token events become text deltas per choice (incremental detokenizer, stop strings),
finish reasons and usage (`OutputProcessor`).

May import: pipeline.request.
"""
