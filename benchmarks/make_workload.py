"""Write a synthetic batch file (token-id prompts, greedy, ignore_eos) for whole-process comparisons.

    python benchmarks/make_workload.py --model DIR -n 128 --prompt-len 16 256 --output-len 16 256 -o w.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from actors.cli.bench import make_workload


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="HF model dir (for its vocab size)")
    parser.add_argument("-n", "--num-requests", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=[16, 256])
    parser.add_argument("--output-len", type=int, nargs=2, default=[16, 256])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    vocab_size = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    workload = make_workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), vocab_size, args.seed)
    with open(args.output, "w") as out:
        for index, (prompt, output_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
            body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True}
            out.write(json.dumps({"custom_id": f"r{index}", "method": "POST", "url": "/v1/completions",
                                  "body": body}) + "\n")
    print(f"{args.output}: {args.num_requests} requests, {workload.useful_tokens} output tokens")


if __name__ == "__main__":
    main()
