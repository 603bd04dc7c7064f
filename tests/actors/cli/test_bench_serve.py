"""`aqueduct bench --serve`: the workload over HTTP through `aqueduct serve`, the figures side by side.

The end-to-end test runs aqueduct's server alone (no peers in tests) on the built-in model; the rest
checks the pieces: the same requests for every server, the flags forwarded, the stream read, the
figures' arithmetic.
"""

from __future__ import annotations

import io

from actors.cli.bench_serve.client import StreamTiming, read_stream
from actors.cli.bench_serve.engine_flags import given_engine_flags
from actors.cli.bench_serve.phases import figures_of
from actors.cli.bench_serve.workload import serve_workload
from actors.cli.main import build_parser, main


def _table(output: str) -> list[list[str]]:
    rows = [line for line in output.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_serve_mode_prints_aqueducts_figures_as_a_table(default_model_path, monkeypatch, capsys):
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
    assert main(["bench", "--serve", "--model", "builtin", "--skip-peer", "--num-requests", "4",
                 "--output-len", "8", "8", "--prompt-words", "8", "16", "--concurrency", "4",
                 "--one-stream-requests", "2", "--num-kv-blocks", "256"]) == 0
    output = capsys.readouterr().out
    assert "llama.cpp: skipped (--skip-peer)" in output and "vLLM: skipped (--skip-peer)" in output
    header, separator, *rows = _table(output)
    assert len(header) == 8 and header[0] == "server" and len(separator) == 8
    assert [row[0] for row in rows] == ["aqueduct"]
    figures = [float(cell.rstrip("x")) for cell in rows[0][1:]]
    assert all(value > 0 for value in figures)
    assert rows[0][5:] == ["1.00x", "1.00x", "1.00x"]  # aqueduct over itself


def test_every_server_gets_the_same_requests_of_the_asked_lengths():
    first = serve_workload(16, (40, 400), (128, 128), seed=3)
    assert first == serve_workload(16, (40, 400), (128, 128), seed=3)
    assert first != serve_workload(16, (40, 400), (128, 128), seed=4)
    assert all(40 <= len(request.prompt.split()) <= 400 and request.max_tokens == 128 for request in first)
    assert len({request.prompt[:40] for request in first}) == 16  # no shared prefixes to cache


def test_only_the_engine_flags_given_are_forwarded_to_the_server():
    args = build_parser().parse_args(["bench", "--serve", "--model", "builtin", "--dtype", "bfloat16",
                                      "--no-enable-prefix-caching", "--enforce-eager", "--num-kv-blocks", "64"])
    assert given_engine_flags(args, skip=frozenset({"model"})) == [
        "--dtype", "bfloat16", "--num-kv-blocks", "64", "--no-enable-prefix-caching", "--enforce-eager"]
    assert given_engine_flags(build_parser().parse_args(["bench", "--serve"])) == []


def _stream(*events: str) -> io.BytesIO:
    return io.BytesIO("".join(f"data: {event}\n\n" for event in events).encode())


def test_tokens_are_the_usage_count_and_a_closing_chunk_is_no_token():
    # llama-server closes with a chunk of only the finish reason; a token may decode to no text yet.
    stream = _stream('{"choices": [{"text": "a", "finish_reason": null}]}',
                     '{"choices": [{"text": "", "finish_reason": null}]}',
                     '{"choices": [{"text": "", "finish_reason": "length"}]}',
                     '{"choices": [], "usage": {"completion_tokens": 2}}', "[DONE]")
    timing = read_stream(stream, sent=0.0)
    assert timing.tokens == 2 and 0 < timing.first_token <= timing.last_token


def test_figures_leave_prefill_out_of_decode_and_time_the_whole_concurrent_run():
    one_stream = [StreamTiming(0.0, 1.0, 2.0, tokens=11), StreamTiming(5.0, 5.5, 6.5, tokens=21)]
    concurrent = [StreamTiming(10.0, 11.0, 14.0, tokens=30), StreamTiming(10.0, 12.0, 15.0, tokens=20)]
    figures = figures_of(one_stream, concurrent)
    assert figures.one_stream_decode_tps == 30 / 2.0
    assert figures.concurrent_output_tps == 50 / 5.0
    assert figures.ttft_p50_s == 1.5 and 1.9 < figures.ttft_p99_s <= 2.0


def test_vllm_gets_the_gguf_file_as_an_hf_checkpoint_without_our_block_file(tmp_path, monkeypatch):
    import json

    from gguf import GGMLQuantizationType

    from actors.cli.bench_serve.servers import vllm_model_dir
    from tests.support.gguf_files import write_gguf
    from tests.support.hf_models import make_tiny_hf_model

    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(make_tiny_hf_model("llama", tmp_path / "llama", seed=4), tmp_path / "tiny-q4_1.gguf",
                      GGMLQuantizationType.Q4_1)
    directory = vllm_model_dir(str(path))
    assert directory == vllm_model_dir(str(path))  # made once
    names = {child.name for child in directory.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names and "gguf_blocks.safetensors" not in names
    assert json.loads((directory / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_vllm_is_given_bfloat16_only_where_the_cpu_multiplies_it(default_model_path, monkeypatch, tmp_path):
    """vLLM gets aqueduct's own `--dtype auto` choice: on an AVX2-only CPU its bfloat16 runs emulated."""
    from actors.cli.bench_serve import servers

    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
    python = tmp_path / "python"
    python.write_text("")
    args = build_parser().parse_args(["bench", "--serve", "--model", "builtin", "--vllm-python", str(python),
                                      "--prompt-words", "8", "16", "--output-len", "8", "8"])
    for native, dtype in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(servers, "cpu_has_bfloat16_arithmetic", lambda native=native: native)
        spec = servers.vllm_server(args, "builtin", 8000)
        assert isinstance(spec, servers.ServerSpec)
        assert spec.command[spec.command.index("--dtype") + 1] == dtype and f"--dtype {dtype}" in spec.weights
