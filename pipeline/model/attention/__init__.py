"""Attention over the paged KV cache: the shapes a family declares (`shape`), the backend chosen for a
device (`selection`): torch's paged backend with the native CPU decode kernel (`paged`, `groups`) or
FlexAttention on CUDA (`flex`, its tile plans and graph buffers); multi-head latent attention over a
cache of one latent row per token (`latent`, DeepSeek); attention sinks (`sinks`, gpt-oss); and the fp8
KV cache (`fp8_kv`).

May import: pipeline.model.cpu (the decode and rope kernels), pipeline.step, pipeline.host_to_device.
"""
