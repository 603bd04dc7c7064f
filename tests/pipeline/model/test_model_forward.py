"""ModelRunner.execute logits equal HF transformers' (float32, atol 1e-4) for every supported
architecture and every kind of step: batched prefill, chunked prefill, decode, mixed steps,
with small and default block sizes and shuffled block ids."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from pipeline.config import CacheConfig, ModelConfig, SchedulerConfig
from pipeline.model.graphs import CUDAGraphRunner, capture_sizes
from pipeline.model.runner import ModelRunner
from pipeline.step.inputs import StepInputs
from tests.support.hf_models import make_tiny_hf_model

ATOL = 1e-4
NUM_BLOCKS = 256
MODELS = ["llama", "llama3", "qwen2", "qwen3", "phi3", "mixtral", "gemma2", "gemma3", "gemma4", "olmo2", "granite",
          "smollm3", "glm4", "qwen3_moe", "qwen2_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4",
          "llama-sharded"]


@dataclass
class Reference:
    path: Path
    hf: torch.nn.Module
    cache: dict[tuple[int, ...], torch.Tensor] = field(default_factory=dict)

    def logits(self, tokens: list[int]) -> torch.Tensor:
        """HF logits [len(tokens), vocab] of one unbatched sequence (memoised)."""
        key = tuple(tokens)
        if key not in self.cache:
            with torch.no_grad():
                self.cache[key] = self.hf(torch.tensor([tokens])).logits[0].float()
        return self.cache[key]


@pytest.fixture(scope="module", params=MODELS)
def ref(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    arch, _, variant = request.param.partition("-")
    path = make_tiny_hf_model(arch, tmp_path_factory.mktemp(request.param), shard=variant == "sharded")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return Reference(path, hf)


def make_runner(path: Path, block_size: int = 16) -> ModelRunner:
    return ModelRunner(ModelConfig(quantization="none", dtype="float32", device="cpu"),
                       CacheConfig(block_size=block_size, num_kv_blocks=NUM_BLOCKS),
                       SchedulerConfig(), str(path))


class Seqs:
    """Sequences with shuffled block ids; builds StepInputs the way TensorPrep would."""

    def __init__(self, block_size: int, seed: int = 0) -> None:
        self.block_size = block_size
        self.rng = np.random.default_rng(seed)
        self.free_blocks = list(self.rng.permutation(NUM_BLOCKS))
        self.tokens: list[list[int]] = []
        self.block_tables: list[list[int]] = []
        self.num_computed: list[int] = []

    def add(self, length: int, max_len: int = 128) -> int:
        self.tokens.append(self.rng.integers(0, 512, length).tolist())
        num_blocks = -(-max_len // self.block_size)
        self.block_tables.append([int(self.free_blocks.pop()) for _ in range(num_blocks)])
        self.num_computed.append(0)
        return len(self.tokens) - 1

    def append_token(self, seq: int) -> None:
        self.tokens[seq].append(int(self.rng.integers(0, 512)))

    def step(self, chunks: list[tuple[int, int]], num_padding: int = 0) -> StepInputs:
        """chunks: (seq, num_new_tokens); every token's logits are requested."""
        ids, positions, slots, query_lens, seq_lens = [], [], [], [], []
        for seq, num_new in chunks:
            start = self.num_computed[seq]
            pos = np.arange(start, start + num_new)
            table = np.array(self.block_tables[seq])
            ids += self.tokens[seq][start:start + num_new]
            positions += pos.tolist()
            # slot = block_table[pos // block_size] * block_size + pos % block_size
            slots += (table[pos // self.block_size] * self.block_size + pos % self.block_size).tolist()
            query_lens.append(num_new)
            seq_lens.append(start + num_new)
            self.num_computed[seq] += num_new
        num_tokens = len(ids)
        width = max(len(self.block_tables[seq]) for seq, _ in chunks)
        tables = np.zeros((len(chunks), width), dtype=np.int32)
        for row, (seq, _) in enumerate(chunks):
            tables[row, : len(self.block_tables[seq])] = self.block_tables[seq]
        return StepInputs(
            input_ids=np.array(ids + [0] * num_padding, dtype=np.int64),
            positions=np.array(positions + [0] * num_padding, dtype=np.int64),
            slot_mapping=np.array(slots + [-1] * num_padding, dtype=np.int64),
            query_start_loc=np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32),
            seq_lens=np.array(seq_lens, dtype=np.int32), block_tables=tables,
            logits_indices=np.arange(num_tokens, dtype=np.int64), num_tokens=num_tokens,
            max_query_len=max(query_lens), max_seq_len=max(seq_lens),
            state_slots=np.array([seq for seq, _ in chunks], dtype=np.int32))  # a sequence's index is its slot

    def expected(self, ref: Reference, chunks: list[tuple[int, int]]) -> torch.Tensor:
        """HF logits for the rows `step(chunks)` produced (call after step)."""
        rows = []
        for seq, num_new in chunks:
            end = self.num_computed[seq]
            rows.append(ref.logits(self.tokens[seq][:end])[end - num_new:end])
        return torch.cat(rows)


def run_and_check(runner: ModelRunner, seqs: Seqs, ref: Reference, chunks: list[tuple[int, int]],
                  num_padding: int = 0) -> None:
    logits = runner.execute(seqs.step(chunks, num_padding))
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, seqs.expected(ref, chunks), atol=ATOL, rtol=0)


def test_batched_full_prefills_match_hf(ref: Reference) -> None:
    runner = make_runner(ref.path)
    seqs = Seqs(runner.block_size)
    # Lengths this different land in separate padded prefill groups; length 1 is decode-shaped.
    lengths = [5, 17, 1, 40, 3]
    run_and_check(runner, seqs, ref, [(seqs.add(n), n) for n in lengths])


def test_chunked_prefill_attends_to_cached_context(ref: Reference) -> None:
    runner = make_runner(ref.path, block_size=4)
    seqs = Seqs(runner.block_size)
    seq = seqs.add(41)
    for chunk in (13, 15, 13):
        run_and_check(runner, seqs, ref, [(seq, chunk)])


@pytest.mark.parametrize("block_size", [4, 16])
def test_decode_steps_match_full_sequence_logits(ref: Reference, block_size: int) -> None:
    runner = make_runner(ref.path, block_size)
    seqs = Seqs(block_size, seed=block_size)
    lengths = [3, 9, 16, 21, 2, 33]
    run_and_check(runner, seqs, ref, [(seqs.add(n), n) for n in lengths])
    for _ in range(4):
        for seq in range(len(lengths)):
            seqs.append_token(seq)
        run_and_check(runner, seqs, ref, [(seq, 1) for seq in range(len(lengths))])


@pytest.mark.parametrize("block_size", [4, 16])
def test_mixed_step_prefill_chunk_and_decodes(ref: Reference, block_size: int) -> None:
    runner = make_runner(ref.path, block_size)
    seqs = Seqs(block_size, seed=1)
    decoders = [seqs.add(n) for n in (7, 12, 30)]
    long_prompt = seqs.add(37)
    run_and_check(runner, seqs, ref, [(seq, len(seqs.tokens[seq])) for seq in decoders] + [(long_prompt, 10)])
    for seq in decoders:
        seqs.append_token(seq)
    # Prefill chunk first, decodes after it, plus trailing padding tokens (slot -1).
    run_and_check(runner, seqs, ref, [(long_prompt, 20)] + [(seq, 1) for seq in decoders], num_padding=3)
    for seq in decoders:
        seqs.append_token(seq)
    run_and_check(runner, seqs, ref, [(decoders[1], 1), (long_prompt, 7), (decoders[0], 1), (decoders[2], 1)])


def test_decode_through_graph_runner_buffers_matches_hf(ref: Reference) -> None:
    """The CUDA-graph path's padding and static metadata, run eagerly (capture=False) on CPU."""
    runner = make_runner(ref.path, block_size=4)
    seqs = Seqs(runner.block_size, seed=2)
    lengths = [4, 11, 6]
    run_and_check(runner, seqs, ref, [(seqs.add(n), n) for n in lengths])
    # A scratch slot past the real blocks: give the runner one extra block for it (blocks are axis 1 of
    # a [2, blocks, ...] K/V cache, axis 0 of a latent one).
    axis = 0 if runner.info.attention.latent_dim is not None else 1
    runner.kv_caches = [torch.cat([c, torch.zeros_like(c.narrow(axis, 0, 1))], dim=axis) for c in runner.kv_caches]
    graphs = CUDAGraphRunner(runner.model, runner.backend, runner.kv_caches, max_num_seqs=8,
                             max_blocks_per_seq=32, scratch_slot=NUM_BLOCKS * 4, device=runner.device,
                             capture=False)
    for _ in range(2):
        for seq in range(len(lengths)):
            seqs.append_token(seq)
        chunks = [(seq, 1) for seq in range(len(lengths))]
        inputs = seqs.step(chunks)
        assert graphs.can_run(inputs)
        with torch.inference_mode():
            logits = runner.model.compute_logits(graphs.run(inputs))
        torch.testing.assert_close(logits, seqs.expected(ref, chunks), atol=ATOL, rtol=0)


def test_capture_sizes_step_by_eight_largest_first() -> None:
    assert capture_sizes(20) == [20, 16, 8, 4, 2, 1]
    assert capture_sizes(32) == [32, 24, 16, 8, 4, 2, 1]
    assert capture_sizes(1) == [1]


def test_runner_reports_model_facts(tmp_path: Path) -> None:
    path = make_tiny_hf_model("qwen3", tmp_path / "m")
    runner = ModelRunner(ModelConfig(quantization="none", dtype="float32", device="cpu"),
                         CacheConfig(kv_cache_memory=2**20), SchedulerConfig(),
                         str(path))
    # 2 (K, V) * 16 slots * 2 kv heads * head_dim 32 * 4 bytes * 2 layers = 16 KiB per block
    assert runner.num_kv_blocks == 2**20 // (16 * 2**10)
    assert runner.kv_caches[0].shape == (2, runner.num_kv_blocks, 16, 2, 32)
    assert runner.eos_token_ids == (2, 3)
    assert runner.max_model_len == 1024 and runner.vocab_size == 512
    assert runner.info.dtype == torch.float32 and runner.device.type == "cpu"
    assert runner.info.head_dim == 32


def test_old_config_form_rope_scaling_loads_the_same(tmp_path: Path) -> None:
    path = make_tiny_hf_model("llama3", tmp_path / "m")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = json.loads((path / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = {**rope, "type": rope.pop("rope_type")}
    (path / "config.json").write_text(json.dumps(config))
    (path / "generation_config.json").unlink()
    ref = Reference(path, hf)
    runner = make_runner(path)
    assert runner.eos_token_ids == (2,)  # falls back to config.json
    seqs = Seqs(runner.block_size)
    run_and_check(runner, seqs, ref, [(seqs.add(90), 90)])


def test_unsupported_architecture_names_supported_ones(tmp_path: Path) -> None:
    path = make_tiny_hf_model("llama", tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"LlamaForCausalLM.*Qwen2ForCausalLM.*Qwen3ForCausalLM"):
        make_runner(path)
    shutil.rmtree(path)


def test_missing_lm_head_falls_back_to_embeddings(tmp_path: Path) -> None:
    path = make_tiny_hf_model("llama", tmp_path / "m")
    weights = load_file(path / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.lm_head.weight = hf.model.embed_tokens.weight
    ref = Reference(path, hf)
    runner = make_runner(path)
    seqs = Seqs(runner.block_size)
    run_and_check(runner, seqs, ref, [(seqs.add(9), 9)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_close_to_float32(tmp_path: Path, dtype: torch.dtype) -> None:
    path = make_tiny_hf_model("qwen3", tmp_path / "m")
    runner = ModelRunner(ModelConfig(quantization="none", device="cpu", dtype=str(dtype).removeprefix("torch.")),
                         CacheConfig(block_size=4, num_kv_blocks=NUM_BLOCKS), SchedulerConfig(), str(path))
    assert runner.kv_caches[0].dtype == dtype
    ref = Reference(path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
    seqs = Seqs(runner.block_size)
    seq = seqs.add(12)
    steps = [[(seq, 12)], [(seq, 1)]]
    for step, chunks in enumerate(steps):
        if step > 0:
            seqs.append_token(seq)
        logits = runner.execute(seqs.step(chunks))
        assert logits.dtype == torch.float32
        torch.testing.assert_close(logits, seqs.expected(ref, chunks), atol=0.1, rtol=0)


def test_cuda_device_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    path = make_tiny_hf_model("llama", tmp_path / "m")
    with pytest.raises(ValueError, match="CUDA is not available"):
        ModelRunner(ModelConfig(quantization="none", dtype="float32", device="cuda"), CacheConfig(num_kv_blocks=4),
                    SchedulerConfig(), str(path))


def test_materialize_gives_real_storage_in_the_asked_dtype() -> None:
    from pipeline.model.loader import materialize

    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.BatchNorm1d(5))
    materialize(model, torch.bfloat16, torch.device("cpu"))
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    assert not any(t.is_meta for t in tensors.values())
    assert tensors["0.weight"].shape == (5, 3) and tensors["0.weight"].dtype == torch.bfloat16
    assert isinstance(model[0].weight, torch.nn.Parameter)
    assert tensors["1.num_batches_tracked"].dtype == torch.int64  # integers keep their dtype
    assert not isinstance(model[1].running_mean, torch.nn.Parameter)
