"""Process tuning: the start-up collector pause always ends with the collector on; compute threads fit
the CPUs the process may use (affinity, cgroup quota)."""

from __future__ import annotations

import gc
import os

import pytest

from actors.kit.process_tuning import (
    cgroup_cpu_limit,
    choose_compute_threads,
    peer_omp_defaults,
    startup_collector_paused,
)


def test_collector_is_paused_inside_and_back_on_after_with_startup_objects_frozen():
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    try:
        with startup_collector_paused():
            assert not gc.isenabled()
            kept = [{"a": [1]}]  # containers are what the collector tracks
        assert gc.isenabled() and kept
        assert gc.get_freeze_count() > frozen_before
    finally:
        gc.unfreeze()


def test_collector_is_back_on_when_start_up_fails():
    with pytest.raises(RuntimeError), startup_collector_paused():
        raise RuntimeError("model failed to load")
    assert gc.isenabled()


# ---- compute threads sized to what the process may use -----------------------------------------

def _v2_box(tmp_path, own_path: str, limits: dict[str, str]):
    """A fake cgroup v2 tree: `limits` maps a cgroup path to its cpu.max line."""
    root = tmp_path / "cgroup"
    (root / own_path.lstrip("/")).mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for path, line in limits.items():
        (root / path.lstrip("/") / "cpu.max").write_text(line + "\n")
    self_cgroup = tmp_path / "self_cgroup"
    self_cgroup.write_text(f"0::{own_path}\n")
    return root, self_cgroup


def test_cgroup_v2_quota_is_the_smallest_along_the_hierarchy(tmp_path):
    root, self_cgroup = _v2_box(tmp_path, "/pods/worker", {"/": "max 100000", "/pods": "150000 100000",
                                                             "/pods/worker": "300000 100000"})
    assert cgroup_cpu_limit(root, self_cgroup) == 1.5


def test_cgroup_v2_without_a_quota_is_unlimited(tmp_path):
    root, self_cgroup = _v2_box(tmp_path, "/", {"/": "max 100000"})
    assert cgroup_cpu_limit(root, self_cgroup) is None


def test_a_container_sees_its_own_cgroup_as_the_root(tmp_path):
    root, self_cgroup = _v2_box(tmp_path, "/", {"/": "100000 100000"})
    self_cgroup.write_text("0::/docker/abc123\n")  # the host's path, not visible inside
    assert cgroup_cpu_limit(root, self_cgroup) == 1.0


def test_cgroup_v1_cfs_quota(tmp_path):
    root = tmp_path / "cgroup"
    cpu = root / "cpu,cpuacct" / "job"
    cpu.mkdir(parents=True)
    (root / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (root / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    (cpu / "cpu.cfs_quota_us").write_text("50000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    self_cgroup = tmp_path / "self_cgroup"
    self_cgroup.write_text("4:memory:/job\n2:cpu,cpuacct:/job\n")
    assert cgroup_cpu_limit(root, self_cgroup) == 0.5
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(root, self_cgroup) is None


def test_no_cgroup_files_means_unknown(tmp_path):
    assert cgroup_cpu_limit(tmp_path / "nothing", tmp_path / "missing") is None


@pytest.mark.parametrize(("requested", "affinity", "quota", "threads"), [
    (None, 8, None, 8),  # no quota: every CPU the affinity allows
    (None, 8, 2.0, 2),  # the quota is tighter than the affinity
    (None, 8, 1.5, 1),  # a fractional quota rounds down
    (None, 8, 0.5, 1),  # never below one
    (None, 2, 4.0, 2),  # the affinity is tighter than the quota
    (3, 8, 1.0, 3),  # --cpu-threads wins
])
def test_compute_threads_fit_affinity_and_quota(requested, affinity, quota, threads):
    assert choose_compute_threads(requested, affinity, quota)[0] == threads


def test_cpu_threads_below_one_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match="cpu_threads must be >= 1"):
        choose_compute_threads(0, 2, None)


def test_a_peer_started_inside_peer_omp_defaults_sees_the_users_wait_policy(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("AQUEDUCT_SET_OMP_WAIT_POLICY", "1")  # as passive_omp_wait leaves it when it chose
    with peer_omp_defaults():
        assert "OMP_WAIT_POLICY" not in os.environ
        assert os.environ["AQUEDUCT_PEER_PROCESS"] == "1"  # a child re-importing main leaves it unset
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "AQUEDUCT_PEER_PROCESS" not in os.environ
    monkeypatch.delenv("AQUEDUCT_SET_OMP_WAIT_POLICY")  # the user's own setting: kept for the peer too
    with peer_omp_defaults():
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
