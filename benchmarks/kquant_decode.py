"""Single-stream decode speed of a Q4_K_M-like GGUF file: its K-quant / Q5_0 / Q8_0 blocks kept
(csrc/gguf_linear.c) vs today's fallback for those types (int8 per channel, requantized at load),
with the file it was made from for reference (SmolLM2's Q4_1 kept 4-bit, its Q8_0 head now kept
as blocks too), and llama.cpp on the same file when
llama-cpp-python is installed.

    python benchmarks/kquant_decode.py [--source FILE.gguf | --hf-dir DIR] [--output-len 64] [--rounds 3]
        [--dtype float32] [--llama-quantize Q4_K_M|Q6_K] [--check-greedy 8]

`--hf-dir`: an HF Llama directory (benchmarks/make_llama.py writes random ones; one whose widths are
multiples of 256 gets real K-quants throughout), written to a float32 GGUF file first.

The file is written next to the cache from `--source` (default: the packaged SmolLM2-135M Q4_1),
each weight dequantized and quantized again the way llama-quantize's Q4_K_M picks types: Q6_K
for the head, for attn_v and ffn_down in the first and last eighth of the layers and every third
between, Q4_K elsewhere; rows whose length is not a multiple of 256 (SmolLM2's 576-wide inputs)
take llama.cpp's fallbacks, Q5_0 for Q4_K and Q8_0 for Q6_K. The quantizer is
tests/support/kquant_blocks.py's (range-based scales, not llama.cpp's search), which changes the
values, not the speed. `--llama-quantize TYPE` makes the file with llama.cpp's own quantizer instead
(llama-cpp-python's `llama_model_quantize`, from an F32 copy of the source). Each round runs every
configuration once, in turn.

`--check-greedy N`: before timing, N prompts of 16 random tokens, 32 greedy tokens each, from the
engine in float32 against transformers reading the same file (its dequantization), token for token
(a divergence at a near-tie of transformers' logits, top-2 margin under 1e-3, counts as equal).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import statistics
import time
from collections.abc import Callable
from unittest import mock

import gguf
import numpy as np
import torch

from actors.cli.bench import gguf_file_of
from benchmarks.cpu_speed import engine_runner, llama_cpp_runner
from pipeline.loading.cache_dir import cache_dir
from tests.support.gguf_files import write_gguf
from tests.support.kquant_blocks import quantize

Q = gguf.GGMLQuantizationType
_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q6_K: Q.Q8_0}  # llama.cpp's, for rows not a multiple of 256


def q4_k_m_type(name: str, shape: tuple[int, ...], layers: int) -> Q | None:
    """The type llama-quantize's Q4_K_M gives GGUF tensor `name` (numpy shape), or None to keep F32."""
    if len(shape) < 2:
        return None
    parts = name.split(".")
    more_bits = False
    if parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down"):
        layer = int(parts[1])
        more_bits = layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2
    chosen = Q.Q6_K if more_bits or parts[0] in ("output", "token_embd") else Q.Q4_K
    return chosen if shape[-1] % 256 == 0 else _FALLBACK[chosen]


def rewrite(source: Path, target: Path, quantized_type: Callable[[str, tuple[int, ...], int], Q | None]) -> None:
    """`source`'s metadata and tensors into `target`, each tensor dequantized to float32 and, where
    quantized_type(name, numpy shape, layers) names a type, quantized to it (else kept F32)."""
    reader = gguf.GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(target), architecture)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub_type = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    layers = int(reader.fields[f"{architecture}.block_count"].contents())
    for tensor in reader.tensors:
        weight = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        qtype = quantized_type(tensor.name, weight.shape, layers)
        if qtype is None:
            writer.add_tensor(tensor.name, weight)
        else:
            writer.add_tensor(tensor.name, quantize(weight.reshape(-1, weight.shape[-1]), qtype).reshape(
                *weight.shape[:-1], -1), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_q4_k_m(source: Path, target: Path) -> None:
    """`source` with every weight re-quantized as q4_k_m_type says; its metadata copied."""
    rewrite(source, target, q4_k_m_type)


def write_f32(source: Path, target: Path) -> None:
    """`source` with every tensor dequantized to F32, its metadata copied (llama-quantize's input)."""
    rewrite(source, target, lambda _name, _shape, _layers: None)


def llama_quantize(source: Path, target: Path, file_type: str) -> None:
    """llama.cpp's own quantizer (llama-cpp-python's binding) on an F32 copy of `source`."""
    import llama_cpp

    f32 = target.with_name(f"{source.stem}-F32-for-llama-quantize.gguf")
    if not f32.exists():
        write_f32(source, f32)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.nthread = torch.get_num_threads()
    if llama_cpp.llama_model_quantize(str(f32).encode(), str(target).encode(), params) != 0:
        raise SystemExit(f"llama.cpp could not quantize {f32} to {file_type}")


def resident_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's weights as held: parameters (norms, float weights) and the quantized layers'
    buffers (a layer shared by two names, a tied head and embedding, once)."""
    from pipeline.model.layers.gguf_linear import GgufLinear

    total = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    for module in model.modules():
        if isinstance(module, GgufLinear):
            total += module.resident_bytes()
        elif type(module).__name__ in ("Int4Linear", "Int8Linear"):
            total += sum(buffer.numel() * buffer.element_size() for buffer in module.buffers(recurse=False))
    return total


def check_greedy(path: Path, count: int) -> None:
    """Our float32 greedy tokens against transformers' reading of the file (module docstring)."""
    from pipeline.request.sampling_params import SamplingParams
    from tests.support.engine_helpers import NEAR_TIE_MARGIN, hf_greedy, make_engine, run_requests
    from tests.support.gguf_files import hf_model_from_gguf

    rng = np.random.default_rng(0)
    vocab = len(gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"].contents())
    requests = {f"p{i}": (rng.integers(3, min(vocab, 4096), 16).tolist(),
                          SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)) for i in range(count)}
    engine = make_engine(path, quantization="gguf", max_model_len=512)
    file_bytes = sum(int(tensor.n_bytes) for tensor in gguf.GGUFReader(path).tensors)
    held = resident_weight_bytes(engine.runner.model)
    print(f"weights held {held / 1e6:.1f} MB, the file's tensors {file_bytes / 1e6:.1f} MB ({held / file_bytes:.3f}x)")
    ours = run_requests(engine, requests)
    hf = hf_model_from_gguf(path)
    equal = 0
    for request_id, (prompt, params) in requests.items():
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)
        tokens = ours[request_id]["choices"][0]["token_ids"]
        first = next((i for i, (a, b) in enumerate(zip(tokens, theirs, strict=True)) if a != b), None)
        margin = None if first is None else float(torch.topk(logits[first], 2).values.diff().abs())
        same = first is None or margin < NEAR_TIE_MARGIN
        equal += same
        print(f"  {request_id}: " + ("equal" if first is None else
                                     f"first differs at {first}, transformers' top-2 margin {margin:.2e}"))
    print(f"greedy tokens equal to transformers' reading of the file (float32): {equal} of {count}")


def type_counts(path: Path) -> str:
    reader = gguf.GGUFReader(path)
    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        name = gguf.GGMLQuantizationType(tensor.tensor_type).name
        counts[name] = counts.get(name, 0) + int(tensor.n_bytes)
    return ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", default=None, help="a GGUF file (default: the packaged SmolLM2 Q4_1)")
    parser.add_argument("--hf-dir", default=None, help="an HF Llama directory instead of --source")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--llama-quantize", default=None, choices=["Q4_K_M", "Q6_K"],
                        help="make the file with llama.cpp's quantizer, of this type")
    parser.add_argument("--check-greedy", type=int, default=0, metavar="N")
    args = parser.parse_args()
    source = Path(args.source) if args.source else gguf_file_of("smollm2")
    if args.hf_dir:
        source = cache_dir() / "benchmarks" / f"{Path(args.hf_dir).name}-F32.gguf"
        if not source.exists():
            write_gguf(Path(args.hf_dir), source)
    suffix = f"llama.cpp-{args.llama_quantize}" if args.llama_quantize else "Q4_K_M-like"
    target = cache_dir() / "benchmarks" / f"{source.stem}-{suffix}.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        if args.llama_quantize:
            llama_quantize(source, target, args.llama_quantize)
        else:
            write_q4_k_m(source, target)
    print(f"{target.name}: {type_counts(target)}")
    if args.check_greedy:
        check_greedy(target, args.check_greedy)
    prompt = list(range(100, 116))
    runners = {"K-quants kept": engine_runner(str(target), args.dtype, "gguf", "auto", False, prompt)}
    with mock.patch("pipeline.model.layers.quantize.load_gguf_linear_kernel", lambda: None):  # today's int8
        runners["int8 fallback"] = engine_runner(str(target), args.dtype, "gguf", "auto", False, prompt)
    runners[f"{source.stem} as it is"] = engine_runner(str(source), args.dtype, "gguf", "auto", False, prompt)
    peer = llama_cpp_runner(str(target), prompt)
    if peer is not None:
        runners["llama.cpp"] = peer
    else:
        print("llama.cpp: skipped (llama-cpp-python not installed)")
    for name, run in runners.items():
        if name != "llama.cpp":
            run(8)
    walls: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            started = time.perf_counter()
            seconds = run(args.output_len)
            walls[name].append(seconds if seconds is not None else time.perf_counter() - started)
    print(f"{args.dtype}, {torch.get_num_threads()} threads, {args.output_len} greedy tokens after a 16-token "
          f"prompt, median of {args.rounds} rounds")
    baseline = args.output_len / statistics.median(walls["int8 fallback"])
    for name, times in walls.items():
        rate = args.output_len / statistics.median(times)
        print(f"{name:<36} {rate:>8.1f} tokens/s  {rate / baseline:>5.2f}x int8 fallback")


if __name__ == "__main__":
    main()
