"""Speculative decoding (prompt lookup, and a draft model if given), single stream, side by side in one process.

    python benchmarks/speculative.py [--model smollm2] [--dtype float32] [--quantization none] [--output-len 128]
                                     [--rounds 3] [--k 4]
                                     [--draft-model DIR_OR_GGUF_OR_NAME] [--no-ngram]
                                     [--worker [--redis-url URL]] [--skip-peer]

Each round runs every (prompt, speculation on/off) pair once, in turn, so load from other
processes falls on all of them alike: one request through the engine's step loop, greedy,
`--output-len` tokens ignoring EOS, decode only timed (from the first token on). Prompts: a
copy-heavy one (repeat a ~150-word paragraph, which the answer copies), a ~300-token passage to repeat
and the same to edit (both longer than a 256-token answer) and a free-running story.
Printed per prompt and speculating engine: median decode tokens/s without and with speculation,
their ratio, the acceptance (accepted / drafted, first round), and in how many rounds the output equals
plain decoding's in the same round (no prefix caching: every round prefills alike).
`--draft-model` adds a draft-model engine (greedy drafts of k tokens, same vocabulary as --model).
`--worker`: each engine runs behind a worker on Redis and the request goes through the wire, timed as
the client receives the reply entries (benchmarks/speculative_peers.py).
With llama-cpp-python installed and a GGUF model, llama.cpp runs the same prompts (as token ids) on
the same file after our rounds, plain and with its prompt lookup (k draft tokens, n-grams up to 4),
in a child process; the ratio column "vs lookup" is our speculating rate over its prompt lookup's.
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import asyncio
import statistics
import time

import torch
from speculative_peers import llama_cpp_rates, worker_decode

from actors.cli.bench import gguf_file_of, llama_cpp_available
from actors.cli.bench_redis import RedisPath
from actors.kit import event_loop
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SpeculativeConfig
from pipeline.engine import LLMEngine
from pipeline.request.sampling_params import SamplingParams

PARAGRAPH = (
    "The river town of Ashford grew up around a mill that ground grain for the farms upstream. In spring the "
    "water rose over the lower fields and the millers raised the sluice gates to spare the wheel. Merchants came "
    "by barge with salt, iron and cloth, and left with flour, wool and cheese. The town hall, built of grey stone "
    "in the year of the great flood, still keeps the ledger in which every barge was written down, with its "
    "owner, its cargo and the toll it paid. Children learn to read from that ledger, tracing the names of "
    "boats that sank long ago, and on the first market day of summer the whole town walks to the mill to watch "
    "the wheel turn again."
)
SECOND_PARAGRAPH = (
    "Upstream, the valley narrows between two wooded ridges, and the road follows the water past a row of "
    "cottages where the mill workers once lived. Each cottage has a small garden of beans and onions, a shed "
    "for firewood and a gate painted the colour its first owner chose. The school stands at the end of the row, "
    "one room with tall windows and a stove in the corner, and every winter the children carry a log each "
    "morning to keep it burning. When the snow comes early the teacher reads aloud from the ledger, and the "
    "class votes on which lost boat deserves a song. Last year they chose a small grey barge that carried apples, "
    "and the song they wrote is still sung at the harvest fair by everyone who remembers the words."
)
PROMPTS = {
    "copy": f"Repeat the following paragraph exactly, word for word.\n\n{PARAGRAPH}",
    # The input-grounded workloads: a ~300-token passage, longer than a 256-token answer, so the whole
    # answer can copy or edit it (the short "copy" runs out of passage before 256 tokens and writes
    # freely after). One paragraph: given two, SmolLM2 repeats the first and ends its answer.
    "copy-300": f"Repeat the following text exactly, word for word.\n\n{PARAGRAPH} {SECOND_PARAGRAPH}",
    "edit-300": (f"Rewrite the following text, changing only the town's name from Ashford to Millbrook.\n\n"
                 f"{PARAGRAPH} {SECOND_PARAGRAPH}"),
    "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def _engine(args: argparse.Namespace, speculative: SpeculativeConfig | None) -> LLMEngine:
    return LLMEngine(EngineConfig(model=ModelConfig(model=args.model, dtype=args.dtype, quantization=args.quantization),
                                  cache=CacheConfig(num_kv_blocks=256, enable_prefix_caching=False),
                                  speculative=speculative))  # no prefix hits: every round prefills the same way


def _chat(engine: LLMEngine, text: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True)


def _decode(engine: LLMEngine, prompt: str, output_len: int, request_id: str) -> tuple[float, list[int]]:
    """Decode tokens/s (after the first token) and the output tokens."""
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True))
    tokens: list[int] = []
    started = None
    while engine.has_unfinished:
        for delta in engine.step():
            for choice in delta.choices:
                if not tokens:
                    started = time.perf_counter()
                    first = len(choice.token_ids)
                tokens += choice.token_ids
    assert started is not None
    return (len(tokens) - first) / (time.perf_counter() - started), tokens


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", default="none", help="gguf: keep the GGUF file's 4-bit weights")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--draft-model", default=None, help="also measure draft-model speculation with this draft")
    parser.add_argument("--no-ngram", action="store_true", help="leave prompt lookup out")
    parser.add_argument("--worker", action="store_true", help="through a worker on Redis instead of the step loop")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    parser.add_argument("--skip-peer", action="store_true", help="no llama.cpp, even where installed")
    return parser.parse_args()


Rates = dict[tuple[str, str], list[float]]
Outputs = dict[tuple[str, str, int], list[int]]


def _rounds(args: argparse.Namespace, engines: dict[str, LLMEngine]) -> tuple[Rates, Outputs, dict]:
    """Every round runs every (prompt, engine) pair once, in turn: in the step loop, or through workers."""
    rates: Rates = {}
    outputs: Outputs = {}  # (prompt, engine, round) -> tokens
    counts: dict[tuple[str, str], tuple[int, int]] = {}
    workers: dict[str, RedisPath] = {}

    async def run_all() -> None:
        if args.worker:
            workers.update({name: RedisPath(engine, args.redis_url) for name, engine in engines.items()})
            await asyncio.sleep(0.5)  # each worker creates its group and starts reading
        try:
            for round_index in range(args.rounds):
                for prompt_name, text in PROMPTS.items():
                    for name, engine in engines.items():
                        await one(round_index, prompt_name, text, name, engine)
        finally:
            for worker in workers.values():
                await worker.close()

    async def one(round_index: int, prompt_name: str, text: str, name: str, engine: LLMEngine) -> None:
        stats = engine.scheduler.speculator
        before = (stats.num_draft_tokens, stats.num_accepted_tokens) if stats else (0, 0)
        request_id = f"{prompt_name}-{round_index}-{name}"
        if args.worker:
            prompt = engine.tokenizer.encode(_chat(engine, text), add_special_tokens=False)
            rate, tokens = await worker_decode(workers[name], prompt, args.output_len, request_id)
        else:
            rate, tokens = _decode(engine, _chat(engine, text), args.output_len, request_id)
        rates.setdefault((prompt_name, name), []).append(rate)
        outputs[(prompt_name, name, round_index)] = tokens
        if stats is not None and round_index == 0:
            counts[(prompt_name, name)] = (stats.num_draft_tokens - before[0], stats.num_accepted_tokens - before[1])

    event_loop.run(run_all())
    return rates, outputs, counts


def _peer(args: argparse.Namespace, engine: LLMEngine) -> Rates | None:
    """llama.cpp's rates on the same prompts and file, or None (with the reason printed)."""
    path = gguf_file_of(args.model)
    if args.skip_peer or path is None or not llama_cpp_available():
        reason = "" if args.skip_peer else " (llama-cpp-python not installed, or not a GGUF model)"
        print(f"llama.cpp: skipped{reason}")
        return None
    prompts = {name: engine.tokenizer.encode(_chat(engine, text), add_special_tokens=False)
               for name, text in PROMPTS.items()}
    rates = llama_cpp_rates(path, prompts, args.output_len, args.rounds, torch.get_num_threads(), args.k)
    if rates is None:
        print("llama.cpp: its process crashed (a native fault in llama-cpp-python); no peer figures")
    return rates


def main() -> None:
    args = _parse()
    engines = {"plain": _engine(args, None)}
    if not args.no_ngram:
        engines["ngram"] = _engine(args, SpeculativeConfig(num_speculative_tokens=args.k, prompt_lookup_max=4,
                                                           prompt_lookup_min=1))
    if args.draft_model is not None:
        engines["draft"] = _engine(args, SpeculativeConfig.from_dict({"model": args.draft_model,
                                                                      "num_speculative_tokens": args.k}))
    rates, outputs, counts = _rounds(args, engines)
    peer = _peer(args, engines["plain"])
    draft = f", draft {args.draft_model}" if args.draft_model else ""
    path = "through a worker on Redis" if args.worker else "engine step loop"
    print(f"model {args.model} ({args.dtype}, quantization {args.quantization}){draft}, {path}, "
          f"{args.output_len} greedy tokens, k={args.k}, median of {args.rounds} rounds (decode tokens/s)")
    peer_header = f" {'llama.cpp':>9} {'lookup':>7} {'vs lookup':>9}" if peer else ""
    print(f"{'prompt':8} {'method':7} {'plain':>8} {'spec':>8} {'ratio':>6} {'accepted':>9} {'equal':>6}{peer_header}")
    for prompt_name in PROMPTS:
        plain = statistics.median(rates[(prompt_name, "plain")])
        for name in engines:
            if name == "plain":
                continue
            rate = statistics.median(rates[(prompt_name, name)])
            drafted, accepted = counts[(prompt_name, name)]
            # Rounds whose output equals the plain engine's in the same round.
            equal = sum(outputs[(prompt_name, "plain", r)] == outputs[(prompt_name, name, r)]
                        for r in range(args.rounds))
            line = (f"{prompt_name:8} {name:7} {plain:8.1f} {rate:8.1f} {rate / plain:6.2f} "
                    f"{f'{accepted}/{drafted}':>9} {f'{equal}/{args.rounds}':>6}")
            if peer:
                theirs = statistics.median(peer[(prompt_name, "plain")])
                lookup = statistics.median(peer[(prompt_name, "lookup")])
                line += f" {theirs:9.1f} {lookup:7.1f} {rate / lookup:9.2f}"
            print(line)


if __name__ == "__main__":
    main()
