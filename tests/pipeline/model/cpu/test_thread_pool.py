"""The decode kernels' thread pool (pipeline/model/cpu/csrc/thread_pool.c) under a C stress harness: every task
of every call runs exactly once, with its own call's function and context, however the calls interleave."""

import os
import pathlib
import shutil
import subprocess

import pytest

CSRC = pathlib.Path(__file__).parents[4] / "pipeline" / "model" / "cpu" / "csrc"
HARNESS = pathlib.Path(__file__).with_name("thread_pool_stress.c")


def test_back_to_back_calls_of_different_sizes_never_mix(tmp_path: pathlib.Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    binary = tmp_path / "thread_pool_stress"
    subprocess.run([compiler, "-O2", "-pthread", f"-I{CSRC}", str(HARNESS), str(CSRC / "thread_pool.c"),
                    "-o", str(binary)], check=True)
    for _ in range(3):
        run = subprocess.run([str(binary), "300000"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
