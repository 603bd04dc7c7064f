"""The building blocks the model families share: RMSNorm in three forms (`norms`), rotary embedding in
two layouts (`rope`; YaRN scaling: `yarn`), the gated MLP (`mlp`), routed experts (`moe`; DeepSeek's
grouped routing and shared experts: `grouped_moe`; gpt-oss's biased, clamped ones: `clamped_moe`, and
MXFP4 dequantization: `mxfp4`), weight-only quantized linear layers (`quantized_linear`) and the swap
of a loaded model's linears for them (`quantize`); gated DeltaNet linear attention (`gated_deltanet`, its
rule and convolution in `gated_delta`) and the per-sequence state it keeps (`recurrent_state`).

May import: pipeline.model.cpu (the native kernels), pipeline.loading (GGUF's kept 4-bit blocks).
"""
