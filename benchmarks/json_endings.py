"""Whether constrained JSON answers end: the share of JSON-object and JSON-schema chat answers that
finish with `stop` within --max-tokens, sampled at temperature 1, for each whitespace rule.

    python benchmarks/json_endings.py --model smollm2 --num-requests 20 --max-tokens 256

A grammar that allows unbounded whitespace between JSON tokens lets a small model write nothing
else until max_tokens; the default rule (pipeline/grammar/compiler.py) bounds it. Each rule runs the
same prompts and seeds; prints, per rule and constraint, the share ended by `stop` and the mean
number of tokens.
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()

import argparse
import statistics
from typing import Any

from pipeline.config import EngineConfig, ModelConfig
from pipeline.engine import LLMEngine
from pipeline.grammar.compiler import DEFAULT_JSON_WHITESPACE
from pipeline.request.sampling_params import SamplingParams

RULES = {"default": None, "json's own (any)": r"[ \t\n\r]*", "llama.cpp's": r"(?:[ \t]?|\n[ \t]{0,20})",
         "one space": r"[ ]?", "compact": "", "light indent": r"(?:[ ]?|\n[ ]{0,8})"}
PROMPTS = ["Describe a pet as JSON.", "Give me a JSON object about a city.", "Reply in JSON: is water wet?",
           "List three fruits as a JSON object.", "A JSON object with your name and age."]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
}


def run(engine: LLMEngine, constraint: dict[str, Any], whitespace: str | None, args: argparse.Namespace,
        ) -> tuple[float, float]:
    """(share ended by stop, mean tokens) over --num-requests chat answers."""
    finishes: dict[str, tuple[str, int]] = {}
    tokens: dict[str, int] = {}
    for index in range(args.num_requests):
        fields = {"max_tokens": args.max_tokens, "temperature": 1.0, "seed": index, "response_format": constraint}
        if whitespace is not None:
            fields["guided_whitespace_pattern"] = whitespace or "(?:)"  # an empty pattern: no whitespace
        messages = [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}]
        request = engine.builder.build(f"r{index}", SamplingParams.from_dict(fields), messages=messages)
        engine.add(request)
    while engine.has_unfinished:
        for delta in engine.step():
            for choice in delta.choices:
                tokens[delta.request_id] = tokens.get(delta.request_id, 0) + len(choice.token_ids)
                if choice.finish_reason is not None:
                    finishes[delta.request_id] = (choice.finish_reason, tokens[delta.request_id])
    stops = sum(reason == "stop" for reason, _ in finishes.values())
    return stops / len(finishes), statistics.fmean(tokens for _, tokens in finishes.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--num-requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rules", default=",".join(RULES), help="comma-separated names of " + ", ".join(RULES))
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=args.model)))
    print(f"default whitespace rule: {DEFAULT_JSON_WHITESPACE!r}")
    for name in args.rules.split(","):
        for kind, constraint in CONSTRAINTS.items():
            share, mean_tokens = run(engine, constraint, RULES[name], args)
            print(f"{name:>18} {kind:>11}: {100 * share:5.1f}% end with stop, {mean_tokens:6.1f} tokens on average")


if __name__ == "__main__":
    main()
