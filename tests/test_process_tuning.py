"""Process tuning: the start-up collector pause always ends with the collector on."""

from __future__ import annotations

import gc

import pytest

from actors.process_tuning import startup_collector_paused


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
