"""The baseline: HF transformers `generate`, static batches with left padding, on a batch file.

Reads the same batch file as `aqueduct batch` (token-id prompts, max_tokens, greedy,
ignore_eos), writes {custom_id, token_ids} lines, prints whole-run figures. Time the whole
process (`time python benchmarks/hf_static_batch.py ...`) next to `time aqueduct batch ...`.
HF runs as a user would run it, at OpenMP's default wait policy: not the PASSIVE policy `aqueduct`
sets for itself, which slowed HF's generate (see actors/cli/bench.py).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("-i", "--input", required=True)
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--batch-size", type=int, default=0, help="0 = all requests in one batch")
    args = parser.parse_args()
    lines = [json.loads(line) for line in Path(args.input).read_text().splitlines() if line.strip()]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # ignore_eos
    model.generation_config.pad_token_id = 0
    batch_size = args.batch_size or len(lines)
    started = time.perf_counter()
    results = []
    for start in range(0, len(lines), batch_size):
        batch = lines[start:start + batch_size]
        prompts = [line["body"]["prompt"] for line in batch]
        width = max(len(p) for p in prompts)
        input_ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        max_new = max(line["body"]["max_tokens"] for line in batch)
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False)
        for row, line in enumerate(batch):
            results.append({"custom_id": line["custom_id"],
                            "token_ids": out[row, width:width + line["body"]["max_tokens"]].tolist()})
    elapsed = time.perf_counter() - started
    useful = sum(line["body"]["max_tokens"] for line in lines)
    with open(args.output, "w") as out_file:
        for result in results:
            out_file.write(json.dumps(result) + "\n")
    print(f"hf static batch {batch_size}: generate {elapsed:.2f} s, {useful / elapsed:.1f} useful tokens/s")


if __name__ == "__main__":
    main()
