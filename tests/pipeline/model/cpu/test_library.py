"""Building the kernels' shared library: every source compiled (in parallel) and linked into one cached file."""

from __future__ import annotations

import ctypes
import os
import shutil

import pytest

from pipeline.model.cpu import library

pytestmark = pytest.mark.skipif(not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")),
                                reason="no C compiler")

SOURCES = {
    "first": "int first_value(void) { return 7; }\n",
    "second": "int second_value(int x) { return 3 * x; }\n",
    "third": "double third_value(double x) { return x / 2; }\n",
}


@pytest.fixture
def csrc(tmp_path, monkeypatch):
    sources = tmp_path / "csrc"
    sources.mkdir()
    for name, code in SOURCES.items():
        (sources / f"{name}.c").write_text(code)
    monkeypatch.setattr(library, "_CSRC", sources)
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(tmp_path / "cache"))
    return sources


def test_every_source_is_compiled_and_linked_into_one_cached_library(csrc, tmp_path):
    built = library._load_library("toy", library._POOL_FLAGS, tuple(SOURCES))
    assert built is not None
    assert library.bind(built, "first_value", [], ctypes.c_int)() == 7
    assert library.bind(built, "second_value", [ctypes.c_int], ctypes.c_int)(5) == 15
    assert library.bind(built, "third_value", [ctypes.c_double], ctypes.c_double)(3.0) == 1.5
    kernels = tmp_path / "cache" / "kernels"
    assert [path.suffix for path in kernels.iterdir()] == [".so"]  # the objects went with their staging folder


def test_a_source_that_does_not_compile_gives_no_library(csrc, tmp_path):
    (csrc / "second.c").write_text("int second_value(int x) { return x +; }\n")
    assert library._load_library("toy", library._POOL_FLAGS, tuple(SOURCES)) is None
    assert list((tmp_path / "cache" / "kernels").iterdir()) == []  # nothing half-built left to load later
