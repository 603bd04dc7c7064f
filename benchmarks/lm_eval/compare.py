"""lm-evaluation-harness against `aqueduct serve` vs its `hf` backend on the same weights (docs/benchmarks.md).

Runs a small local multiple-choice task (aqueduct_mc/: 32 items written for this check, no downloads)
twice: `lm-eval --model local-completions` against an `aqueduct serve` started here (echo + logprobs
over token-id prompts, several prompts per request), and `lm-eval --model hf` on the same model
directory; then compares every (item, choice) loglikelihood and the accuracy. Exit status 1 when a
loglikelihood differs by more than --tolerance or the accuracies differ.

    .venv/bin/python benchmarks/lm_eval/compare.py --lm-eval /work/venv-lmeval/bin/lm-eval

lm-eval lives in a venv of its own (it pins its own dependencies):
`python3 -m venv V && V/bin/pip install torch==2.13.0 && V/bin/pip install "lm-eval[hf,api]"`.
--model: an HF model directory, `smollm2` (the packaged GGUF, dequantized to float32 into the
cache: an HF directory both sides load) or `builtin`; both sides compute in float32.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

from pipeline.loading.model_source import resolve_model

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TASK = "aqueduct_mc"


def main() -> int:
    args = _arguments()
    model_dir = resolve_model(args.model, torch.float32).path
    output = Path(args.output or tempfile.mkdtemp(prefix="aqueduct-lm-eval-"))
    port = _free_port()
    server = _serve(model_dir, port)
    try:
        _wait_healthy(port, server)
        served = _lm_eval(args, "local-completions", ",".join([
            f"model={model_dir.name}", f"base_url=http://127.0.0.1:{port}/v1/completions",
            f"tokenizer={model_dir}", "tokenizer_backend=huggingface", "tokenized_requests=True",
            f"max_length={args.max_length}", "num_concurrent=1", "max_retries=1"]), output / "served")
    finally:
        server.terminate()
        server.wait(timeout=30)
    reference = _lm_eval(args, "hf", f"pretrained={model_dir},dtype=float32,max_length={args.max_length}",
                         output / "hf", "--device", "cpu")
    report = compare(served, reference, args.tolerance)
    report["model"] = str(model_dir)
    print(json.dumps(report, indent=2))
    return 0 if report["agree"] else 1


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lm-eval", default="lm-eval", help="the lm-eval command (of its own venv)")
    parser.add_argument("--model", default="smollm2", help="an HF model directory, smollm2 or builtin")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per request (a list of prompts)")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--tolerance", type=float, default=1e-3, help="the largest loglikelihood difference")
    parser.add_argument("--output", help="where lm-eval writes its results (default: a temporary directory)")
    return parser.parse_args()


def _serve(model_dir: Path, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "actors.cli.main", "serve", "--model", str(model_dir), "--dtype", "float32",
               "--port", str(port)]
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_healthy(port: int, server: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"aqueduct serve exited with status {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("aqueduct serve did not become healthy")


def _lm_eval(args: argparse.Namespace, backend: str, model_args: str, output: Path, *extra: str) -> Path:
    """Run one lm-eval backend on the task (offline: the task's data is local); returns its samples file."""
    command = [args.lm_eval, "--model", backend, "--model_args", model_args, "--tasks", TASK,
               "--include_path", str(HERE), "--batch_size", str(args.batch_size), "--log_samples",
               "--output_path", str(output), *extra]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run(command, cwd=HERE, env=environment, check=True)
    return next(output.rglob(f"samples_{TASK}_*.jsonl"))


def compare(served: Path, reference: Path, tolerance: float) -> dict[str, Any]:
    """Per (item, choice) loglikelihood differences and both accuracies from two samples files."""
    ours, theirs = _samples(served), _samples(reference)
    if sorted(ours) != sorted(theirs):
        raise ValueError("the two runs scored different items")
    differences = [abs(a - b) for doc_id in ours for a, b in zip(ours[doc_id]["scores"],
                                                                      theirs[doc_id]["scores"], strict=True)]
    accuracy = {name: sum(doc["acc"] for doc in run.values()) / len(run)
                for name, run in (("served", ours), ("hf", theirs))}
    same_picks = sum(ours[doc_id]["acc"] == theirs[doc_id]["acc"] for doc_id in ours)
    return {"items": len(ours), "loglikelihoods": len(differences), "max_abs_difference": max(differences),
            "tolerance": tolerance, "accuracy": accuracy, "items_scored_the_same": same_picks,
            "agree": max(differences) <= tolerance and accuracy["served"] == accuracy["hf"]}


def _samples(path: Path) -> dict[int, dict[str, Any]]:
    samples = {}
    for line in path.read_text().splitlines():
        sample = json.loads(line)
        # resps: per choice, [[loglikelihood, is_greedy]]
        scores = [float(response[0][0]) for response in sample["resps"]]
        samples[int(sample["doc_id"])] = {"scores": scores, "acc": float(sample["acc"])}
    return samples


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
