"""Python calls per generated token in `aqueduct serve`: its event loop and its device thread.

    python benchmarks/serve_host_calls.py [--requests 2] [--max-tokens 256] [engine flags, e.g. --model smollm2]

Starts `aqueduct serve` in a child process, sends a warm-up request, then profiles (cProfile, both
threads) while one stream of requests is answered, and prints each thread's Python function calls
per token. A count, not a time: it does not move with the load on a shared box, so two builds
compare on it run for run (the profiled seconds are printed too, inflated by the profiler). On two
cores the event loop's work competes with the compute threads for a core, and the device thread's
Python runs between native calls with the other core idle: both add to every token of one stream.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path

START, STOP = signal.SIGUSR1, signal.SIGUSR2


def child(port: int, stats_dir: Path, serve_flags: list[str]) -> int:
    """`aqueduct serve` with both threads' profilers switched by START / STOP."""
    from actors.kit.process_tuning import passive_omp_wait

    passive_omp_wait()  # as the `aqueduct` CLI does, before torch loads
    from actors.cli.main import main
    from actors.worker import stages

    main_profile, device_profile = cProfile.Profile(), cProfile.Profile()
    profiling = [False]
    run_step = stages.DeviceSteps.run

    def profiled_step(self: stages.DeviceSteps, *args: object) -> None:
        if profiling[0]:
            device_profile.runcall(run_step, self, *args)
        else:
            run_step(self, *args)

    def start(*_: object) -> None:  # signal handlers run on the main thread: the event loop's
        profiling[0] = True
        main_profile.enable()

    def stop(*_: object) -> None:
        main_profile.disable()
        profiling[0] = False
        for name, profile in (("event_loop", main_profile), ("device", device_profile)):
            profile.dump_stats(stats_dir / f"{name}.part")
            (stats_dir / f"{name}.part").rename(stats_dir / f"{name}.prof")  # whole, once it appears

    stages.DeviceSteps.run = profiled_step  # type: ignore[method-assign]
    signal.signal(START, start)
    signal.signal(STOP, stop)
    (stats_dir / "pid").write_text(str(os.getpid()))
    return main(["serve", "--port", str(port), "--log-level", "WARNING", *serve_flags])


def parent(args: argparse.Namespace, serve_flags: list[str]) -> None:
    from actors.cli.bench_serve.client import stream_completion
    from actors.cli.bench_serve.process import free_port, running_server
    from actors.cli.bench_serve.servers import ServerSpec
    from actors.cli.bench_serve.workload import ServeRequest, serve_workload, warmup_request

    port = free_port()
    model = next((serve_flags[i + 1] for i, flag in enumerate(serve_flags[:-1]) if flag == "--model"), "smollm2")
    with tempfile.TemporaryDirectory() as stats_dir:
        command = [sys.executable, __file__, "--child", "--port", str(port), "--stats-dir", stats_dir, *serve_flags]
        spec = ServerSpec("aqueduct", command, model, peer=False)
        with running_server(spec, port, Path(stats_dir) / "server.log", timeout_s=600):
            pid = int((Path(stats_dir) / "pid").read_text())
            stream_completion(port, model, warmup_request())
            requests = [ServeRequest(request.prompt, args.max_tokens)
                        for request in serve_workload(args.requests, (40, 400), (1, 1), seed=0)]
            os.kill(pid, START)
            tokens = sum(stream_completion(port, model, request).tokens for request in requests)
            os.kill(pid, STOP)
            profiles = {name: Path(stats_dir) / f"{name}.prof" for name in ("event_loop", "device")}
            while not all(path.exists() for path in profiles.values()):
                time.sleep(0.1)
        print(f"{tokens} tokens, one stream ({args.requests} requests, prompts of 40-400 words)")
        for name, path in profiles.items():
            stats = pstats.Stats(str(path))
            print(f"{name}: {stats.total_calls / tokens:.0f} Python calls a token "
                  f"({stats.total_tt / tokens * 1e3:.2f} ms a token under the profiler)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2, help="requests of the one stream, one at a time")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens each request generates")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stats-dir", type=Path, help=argparse.SUPPRESS)
    args, serve_flags = parser.parse_known_args()
    if args.child:
        sys.exit(child(args.port, args.stats_dir, serve_flags))
    parent(args, serve_flags)


if __name__ == "__main__":
    main()
