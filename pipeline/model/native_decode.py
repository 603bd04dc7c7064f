"""Every decoder layer of a decode step in one native call (CPU, csrc/decoder_layers.c).

The per-op path makes ~8 kernel calls per layer (norm, qkv, rope + KV write, attention, o, norm,
gate_up, down) with a module call, an output allocation and a few views around each, and two torch
adds: for SmolLM2's 30 layers ~240 ctypes calls, a few microseconds of Python apiece. Here one call
runs the same kernels in the same order with the same roundings, so hidden states, tokens and
logprobs are the per-op path's bit for bit (tests/pipeline/model/test_native_decode.py).

Applies (NativeDecoder.build) to Llama-form models (Llama, Mistral, Qwen2 and others built from
llama.py's layers without q/k norms) on the CPU when every projection runs a native kernel (4- or
8-bit quantized, GGUF blocks (gguf_linear.py), or the few-rows kernel for float32/bfloat16 weights), the
norms are native, no LoRA or tensor-parallel wrapper sits on a projection, and the KV cache is
float32/bfloat16. Per step (NativeDecoder.__call__) when every row is one sequence's decode token (a
short float32 prefill's rows count as such: attention/groups.py's rows_as_sequences; this call writes
every row's K/V before any row attends) and the few-rows kernels take that many rows (up to 8, or 4
for float32 weights kept beside oneDNN's packed copy, or 256 where float32 weights are kept as the
panel kernel's panels instead, on CPUs with AVX-512 or AVX2, 64 for bfloat16 panels; quantized layers below
quantized_linear.dequantize_min_rows, or, with bfloat16 copies (bf16_copies.py), below their
COPY_MIN_ROWS, or up to 64 where the copies keep panels, which then take COPY_MIN_ROWS rows and
more; 4-bit layers on CPUs with AMX any number, AMX tiles taking AMX_MIN_ROWS rows and more, as per op);
any other step takes the per-op path.
AQUEDUCT_NATIVE_DECODE=0 turns it off.

`on_layers_start`, when set, is called as the layers start: just before the native call, or at once
when the step takes the per-op path. The worker's device thread hands the previous step's result to
the event loop there (actors/worker/stages.py), so the event loop's work on it (which holds the GIL) runs
while this call runs without the GIL, not while the step's Python prelude needs it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.attention.groups import TorchAttentionMetadata
from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.model.attention.windows import Chunk
from pipeline.model.cpu.kernels import FewRowsLinearKernel, load_decoder_layers
from pipeline.model.cpu.linear import FewRowsLinear, PackedLinear
from pipeline.model.layers.bf16_copies import COPY_MIN_ROWS, copy_takes
from pipeline.model.layers.gguf_linear import GgufLinear
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.norms import RMSNorm
from pipeline.model.layers.quantized_linear import AMX_MIN_ROWS, Int4Linear, Int8Linear, dequantize_min_rows
from pipeline.model.models.llama import Attention, DecoderLayer, LlamaForCausalLM

_LINEAR_INT4, _LINEAR_INT8, _LINEAR_FLOAT, _LINEAR_GGUF = 0, 1, 2, 3
# _Linear.weight_bf16 of panels by their dtype: float32, bfloat16 pairs, float32 values as bfloat16 halves
_PANEL_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int32: 2}
ANY_ROWS = 1 << 30  # the row limit of layers whose kernels take any number of rows (quantized)
_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


class _Linear(ctypes.Structure):
    _fields_ = [("kind", _i64), ("weight_bf16", _i64), ("values", _ptr), ("scales", _ptr), ("bias", _ptr),
                ("out_features", _i64), ("in_features", _i64), ("panels", _ptr), ("copy_panels", _ptr),
                ("copy_bias", _ptr), ("copy_from_rows", _i64), ("amx_from_rows", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _ptr), ("post_norm", _ptr), ("input_eps", _f32), ("post_eps", _f32),
                ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
                ("key_cache", _ptr), ("value_cache", _ptr), ("window", _i64)]


class _Step(ctypes.Structure):
    _fields_ = [("rows", _i64), ("hidden_size", _i64), ("num_heads", _i64), ("num_kv_heads", _i64),
                ("head_dim", _i64), ("block_size", _i64), ("cos", _ptr), ("sin", _ptr), ("slots", _ptr),
                ("block_tables", _ptr), ("block_table_stride", _i64), ("seq_lens", _ptr), ("max_seq_len", _i64),
                ("scale", _f32), ("softcap", _f32), ("io_bf16", _i64), ("threads", _i64)]


class NativeDecoder:
    """Runs a decode step's decoder layers in one call; __call__ returns None where it does not apply."""

    def __init__(self, function: ctypes._CFuncPtr, layers: ctypes.Array[_Layer], kept: list[torch.Tensor],
                 max_rows: int, dtype: torch.dtype, backend: TorchPagedAttention, num_heads: int,
                 hidden_size: int) -> None:
        self._function = function
        self._layers = layers
        self._kept = kept  # tensors the layer descriptions point into (float32 copies of biases)
        self.max_rows = max_rows
        self.dtype = dtype
        self._backend = backend
        self._num_heads = num_heads
        self._hidden_size = hidden_size
        self._bound_caches: Sequence[torch.Tensor] | None = None
        self._caches_fit = False
        self.on_layers_start: Callable[[], None] | None = None  # module docstring

    @classmethod
    def build(cls, model: nn.Module) -> NativeDecoder | None:
        """For `model` (or a vision model's language model) when it qualifies (module docstring), else None."""
        model = getattr(model, "language_model", model)
        function = load_decoder_layers()
        if function is None or os.environ.get("AQUEDUCT_NATIVE_DECODE", "1") == "0" or \
                type(model) is not LlamaForCausalLM:
            return None
        backend = model.model.layers[0].self_attn.backend
        dtype = model.model.embed_tokens.weight.dtype
        if (not isinstance(backend, TorchPagedAttention) or backend.decode_kernel is None
                or backend.rope_kv_kernel is None or dtype not in (torch.float32, torch.bfloat16)
                or model.model.embed_tokens.weight.device.type != "cpu"):
            return None
        kept: list[torch.Tensor] = []
        described = [_describe_layer(layer, kept, dtype) for layer in model.model.layers]
        if any(entry is None for entry in described):
            return None
        layers = (_Layer * len(described))(*(entry[0] for entry in described))
        max_rows = min(entry[1] for entry in described)
        attention = model.model.layers[0].self_attn
        return cls(function, layers, kept, max_rows, dtype, backend, attention.num_heads, model.config.hidden_size)

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, metadata: object,
                 kv_caches: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """The hidden states after every layer (before the final norm), or None: take the per-op path."""
        group = self._decode_group(hidden, metadata, kv_caches)
        if group is None:
            self._layers_starting()
            return None
        assert isinstance(metadata, TorchAttentionMetadata)
        hidden = hidden.clone(memory_format=torch.contiguous_format)  # updated in place
        backend = self._backend
        step = _Step(hidden.shape[0], self._hidden_size, self._num_heads, backend.num_kv_heads, backend.head_dim,
                     backend.block_size, cos.data_ptr(), sin.data_ptr(), metadata.slot_mapping.data_ptr(),
                     group.block_tables.data_ptr(), group.block_tables.shape[1], group.seq_lens.data_ptr(),
                     group.max_seq_len, backend.scale, backend.logit_softcap or 0.0,
                     int(self.dtype == torch.bfloat16), torch.get_num_threads())
        self._layers_starting()
        failed = self._function(hidden.data_ptr(), self._layers, len(self._layers), ctypes.byref(step))
        if failed:  # shapes were checked in build: only memory can run out
            raise MemoryError(f"the native decoder layers failed (code {failed})")
        return hidden

    def _layers_starting(self) -> None:
        if self.on_layers_start is not None:
            self.on_layers_start()

    def _decode_group(self, hidden: torch.Tensor, metadata: object, kv_caches: Sequence[torch.Tensor]) -> object:
        """The step's one decode group when every row is a decode token the kernels take, else None."""
        rows = hidden.shape[0]
        if (not 0 < rows <= self.max_rows or hidden.dtype != self.dtype
                or not isinstance(metadata, TorchAttentionMetadata) or metadata.write_rows is not None
                or metadata.slot_mapping.shape[0] != rows):
            return None
        view = next(iter(metadata.views.values()))  # every window's view splits the rows alike
        if view.prefills or len(view.decodes) != 1:
            return None
        group = view.decodes[0]
        if not group.all_rows or group.block_tables is None or group.seq_lens is None:
            return None
        if kv_caches is not self._bound_caches:
            self._bind(kv_caches)
        return group if self._caches_fit else None

    def _bind(self, kv_caches: Sequence[torch.Tensor]) -> None:
        """Point each layer at its K and V halves ([2, blocks, block_size, kv_heads, head_dim] caches),
        once per list of caches (the runner keeps one for its life); fp8 caches keep the per-op path."""
        self._bound_caches = kv_caches
        self._caches_fit = all(isinstance(cache, torch.Tensor) and cache.dtype == self.dtype
                               and cache.is_contiguous() for cache in kv_caches)
        if not self._caches_fit:
            return
        for layer, cache in zip(self._layers, kv_caches, strict=True):
            layer.key_cache = cache.data_ptr()
            layer.value_cache = cache.data_ptr() + cache.stride(0) * cache.element_size()


def _describe_layer(layer: nn.Module, kept: list[torch.Tensor], dtype: torch.dtype) -> tuple[_Layer, int] | None:
    """The C description of one decoder layer and the most rows its kernels take, or None."""
    if type(layer) is not DecoderLayer or type(layer.self_attn) is not Attention or type(layer.mlp) is not GatedMLP:
        return None
    attention, mlp = layer.self_attn, layer.mlp
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    # (The C layers take a sliding window, not a chunk: attention/windows.py.)
    if attention.q_norm is not None or mlp.activation is not F.silu or isinstance(attention.window, Chunk) or \
            not all(type(norm) is RMSNorm and norm.kernel is not None for norm in norms):
        return None
    linears = [_describe_linear(module, kept, dtype) for module in
               (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    if any(entry is None for entry in linears):
        return None
    for norm in norms:
        if not norm.weight.is_contiguous():
            return None
    described = _Layer(norms[0].weight.data_ptr(), norms[1].weight.data_ptr(), norms[0].eps, norms[1].eps,
                       *(entry[0] for entry in linears), None, None, attention.window or 0)
    return described, min(entry[1] for entry in linears)


def _describe_linear(module: nn.Module, kept: list[torch.Tensor], dtype: torch.dtype) -> tuple[_Linear, int] | None:
    """(kind, pointers, shape) of a projection whose native kernel the C side can call, and its row limit
    (a quantized layer's bfloat16 copy takes COPY_MIN_ROWS rows and more: bf16_copies.py; a 4-bit layer's
    AMX tiles AMX_MIN_ROWS rows and more, any number)."""
    described = _describe_kernel(module, kept, dtype)
    if described is not None and copy_takes(module, COPY_MIN_ROWS, dtype):
        copy = module.__dict__["bf16_copy"]
        if copy.panels is None or described[1] < COPY_MIN_ROWS - 1:  # the kernel must take every row below
            return described[0], min(described[1], COPY_MIN_ROWS - 1)
        linear = described[0]  # its kernel below COPY_MIN_ROWS, the copy's panels from there
        linear.copy_panels, linear.copy_bias, linear.copy_from_rows = (
            copy.panels.data_ptr(), _float32_bias(copy, kept), COPY_MIN_ROWS)
        return linear, copy.panel_rows
    if described is not None and type(module) is Int4Linear and module.amx_takes(AMX_MIN_ROWS, dtype):
        linear, limit = described
        if limit < AMX_MIN_ROWS - 1:  # the kernel must take every row below
            return linear, limit
        linear.amx_from_rows = AMX_MIN_ROWS  # AMX tiles from there, as the per-op path (csrc/int4_amx.c)
        return linear, ANY_ROWS
    return described


def _describe_kernel(module: nn.Module, kept: list[torch.Tensor], dtype: torch.dtype) -> tuple[_Linear, int] | None:
    bias = _float32_bias(module, kept)
    if type(module) is Int4Linear and module.native is not None:  # more rows take the per-op path's product
        return _Linear(_LINEAR_INT4, 0, module.column_blocks.data_ptr(), module.block_scales.data_ptr(), bias,
                       module.out_features, module.in_features), min(ANY_ROWS, dequantize_min_rows(dtype) - 1)
    if type(module) is Int8Linear and module.native is not None:
        return _Linear(_LINEAR_INT8, 0, module.column_blocks.data_ptr(), module.scales.data_ptr(), bias,
                       module.out_features, module.in_features), min(ANY_ROWS, dequantize_min_rows(dtype, bits=8) - 1)
    if type(module) is GgufLinear:  # the segment array lives in the module (rebuilt only if its buffers move)
        segments = module.segments()
        return _Linear(_LINEAR_GGUF, 0, ctypes.addressof(segments), None, bias, module.out_features,
                       module.in_features), min(ANY_ROWS, module.dequantize_min_rows(dtype) - 1)
    if type(module) is PackedLinear and module.panels is not None:  # every row count it takes: the panels
        return _Linear(_LINEAR_FLOAT, _PANEL_KINDS[module.panels.dtype], None, None, bias,
                       module.out_features, module.in_features, module.panels.data_ptr()), module.panel_rows
    if type(module) is FewRowsLinear:
        weight, max_rows = module.weight, FewRowsLinearKernel.MAX_ROWS
    elif type(module) is PackedLinear and module.plain_weight is not None:
        weight, max_rows = module.plain_weight, PackedLinear.FEW_ROWS
    else:
        return None
    if weight.dtype not in (torch.float32, torch.bfloat16) or not weight.is_contiguous():
        return None
    return _Linear(_LINEAR_FLOAT, int(weight.dtype == torch.bfloat16), weight.data_ptr(), None, bias,
                   module.out_features, module.in_features, None), max_rows


def _float32_bias(module: nn.Module, kept: list[torch.Tensor]) -> int | None:
    bias = getattr(module, "bias", None)
    if bias is None:
        return None
    bias = bias.detach().float().contiguous()
    kept.append(bias)
    return bias.data_ptr()
