"""The step's plain data, passed between the stages: the plan (scheduler -> tensor prep), the
model inputs and sampling batch (tensor prep -> model and sampler), the prepared step, the result
(sampler -> scheduler).

May import: pipeline.request (and numpy and torch for the arrays it holds). No stage package.
"""
