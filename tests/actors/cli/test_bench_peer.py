"""`aqueduct bench`'s baselines: the GGUF file the llama.cpp column runs and how, and HF's own process."""

from __future__ import annotations

from actors.cli.bench import Workload, gguf_file_of, run_llama_cpp, time_hf


def test_the_peer_runs_the_gguf_file_the_model_names(tmp_path):
    single = tmp_path / "one"
    single.mkdir()
    (single / "m.Q4_1.gguf").write_bytes(b"GGUF")
    assert gguf_file_of(str(single / "m.Q4_1.gguf")) == single / "m.Q4_1.gguf"
    assert gguf_file_of(str(single)) == single / "m.Q4_1.gguf"
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    assert gguf_file_of(str(hf_dir)) is None  # an HF checkpoint has no llama.cpp column
    assert gguf_file_of("builtin") is None


class _FakeLlama:
    """llama-cpp-python's generate: an endless token stream after the prompt."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.drawn = 0

    def generate(self, tokens, **_kwargs):
        self.prompts.append(list(tokens))
        while True:
            self.drawn += 1
            yield 7


def test_the_peer_generates_each_requests_output_length_one_request_at_a_time():
    llama = _FakeLlama()
    assert run_llama_cpp(llama, Workload(prompts=[[1, 2], [3]], output_lens=[4, 2])) >= 0
    assert llama.prompts == [[1, 2], [3]] and llama.drawn == 6



def test_hf_runs_in_its_own_process_with_the_users_openmp_policy(default_model_path, monkeypatch):
    # As after passive_omp_wait in this process: the child must not inherit our PASSIVE.
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("AQUEDUCT_SET_OMP_WAIT_POLICY", "1")
    seconds, policy = time_hf(str(default_model_path), Workload([[5, 6, 7], [8, 9]], [3, 2]), 2, threads=1)
    assert seconds > 0 and policy is None
