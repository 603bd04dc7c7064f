"""`aqueduct bench --serve`: the workload through `aqueduct serve` and the peers' own OpenAI servers.

args.py (the flags; light, imported when the parser is built), run.py (the command), servers.py and
process.py (the servers and their lifetimes), workload.py, client.py and phases.py (what is sent and
timed).

May import: actors.cli.bench (the GGUF file of a model), actors.cli.engine_args, actors.kit.process_tuning,
pipeline.loading, pipeline.model.cpu.library (whether the CPU multiplies bfloat16: vLLM's dtype).
"""
