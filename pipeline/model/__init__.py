"""Device code: the forward pass from a step's inputs to logits, and the weights and KV cache it runs on.

Rooms, each importing only from those listed after it (pyproject.toml's contracts check this):
- at the top, what puts a model together: `runner` (weights, KV cache, a step's forward, tensor
  parallel ranks), `loader` (config, dtype, device, weights into a family's module), `memory_profile`,
  `graphs` (CUDA graphs for decode), `encoder_cache` (vision encoders' outputs by image),
  `lora` (LoRA slot tensors wrapped around a Llama-form model's linears) and `native_decode` (a
  Llama-form decoder layer chained in C on the CPU);
- models/ (one module per family) and parallel/ (tensor parallelism), apart;
- attention/ (paged backends, fp8 KV) and layers/ (norms, rope, MLP, MoE, quantized linears, linear
  attention and its per-sequence state), apart;
- cpu/ (the native kernels: csrc/ and their Python side).
Only the top and models/ name a model family.

May import: pipeline.config, pipeline.step, pipeline.request, pipeline.host_to_device,
pipeline.loading, pipeline.lora.
"""
