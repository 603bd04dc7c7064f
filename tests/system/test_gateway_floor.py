"""benchmarks/gateway_floor.py drives the real gateway app over a stand-in backend: it must keep up with the
Backend protocol (a missing method once made the app answer 500 and the benchmark wait forever)."""

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_gateway_floor_benchmark_runs() -> None:
    finished = subprocess.run([sys.executable, str(BENCHMARKS / "gateway_floor.py")], cwd=BENCHMARKS,
                              capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "first token p50" in finished.stdout
