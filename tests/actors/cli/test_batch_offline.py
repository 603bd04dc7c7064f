"""`aqueduct batch` runs the engine loop (run_offline); it must answer exactly as the actor graph does."""

from __future__ import annotations

import json

import pytest
from tqdm import tqdm

from actors.cli.batch import read_batch_file, run_embedded, run_offline
from tests.support.engine_helpers import make_engine

BODIES = {
    "greedy-text": {"prompt": "The river runs", "max_tokens": 12, "temperature": 0},
    "sampled-n3": {"prompt": "Water under", "max_tokens": 10, "n": 3, "temperature": 0.8, "seed": 5,
                   "ignore_eos": True},
    "logprobs": {"prompt": [5, 6, 7, 8], "max_tokens": 6, "temperature": 0, "logprobs": 3, "prompt_logprobs": 2,
                 "ignore_eos": True},
    "stop-string": {"prompt": "A bridge", "max_tokens": 30, "temperature": 0.7, "stop": [" the", "e"]},
    "penalties": {"prompt": [9, 10, 11, 12, 13], "max_tokens": 16, "temperature": 1.0, "top_k": 20, "top_p": 0.9,
                  "repetition_penalty": 1.3, "frequency_penalty": 0.5, "min_tokens": 4},
    "best-of": {"prompt": "Water under", "max_tokens": 8, "n": 2, "best_of": 4, "temperature": 0.9, "seed": 3,
                "ignore_eos": True},
    "beam": {"prompt": "The river runs", "max_tokens": 8, "n": 2, "best_of": 3, "use_beam_search": True,
             "temperature": 0, "length_penalty": 0.7, "early_stopping": "never"},
    "too-long": {"prompt": list(range(1, 3000)), "max_tokens": 3},
    "bad-token": {"prompt": [1, 99999], "max_tokens": 3},
    "long-prompt": {"prompt": [(i * 37) % 4000 + 3 for i in range(300)], "max_tokens": 8, "ignore_eos": True},
    "guided-choice": {"prompt": "Pick", "max_tokens": 8, "n": 2, "temperature": 1.0, "seed": 4,
                      "guided_choice": ["north", "south"]},
    "guided-regex": {"prompt": "Code", "max_tokens": 12, "temperature": 0, "structured_outputs": {"regex": "[a-f]{4}"}},
}


@pytest.fixture(scope="module")
def batch_requests(tmp_path_factory):
    source = tmp_path_factory.mktemp("offline") / "in.jsonl"
    source.write_text("\n".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
                                            "body": body}) for custom_id, body in BODIES.items()) + "\n")
    return [line.request for line in read_batch_file(source)]


class _Counter:
    """Counts progress updates (a disabled tqdm does not)."""

    n = 0

    def update(self, count: int) -> None:
        self.n += count


def _assert_same_results(ours: dict[str, dict], graph: dict[str, dict]) -> None:
    assert ours.keys() == graph.keys()
    for request_id, result in ours.items():
        expected = graph[request_id]
        assert result["error"] == expected["error"], request_id
        if result["error"] is not None:
            continue
        assert result["usage"]["prompt_tokens"] == expected["usage"]["prompt_tokens"]
        assert result["usage"]["completion_tokens"] == expected["usage"]["completion_tokens"]
        assert (result["prompt_logprobs"] is None) == (expected["prompt_logprobs"] is None)
        for choice, other in zip(result["choices"], expected["choices"], strict=True):
            for key in ("index", "token_ids", "text", "finish_reason", "stop_reason"):
                assert choice[key] == other[key], (request_id, key)
            if choice["logprobs"] is not None:
                ours_lp = [e["logprob"] for e in choice["logprobs"]]
                assert ours_lp == pytest.approx([e["logprob"] for e in other["logprobs"]], abs=1e-4)
                assert [e["rank"] for e in choice["logprobs"]] == [e["rank"] for e in other["logprobs"]]


@pytest.mark.parametrize("max_unfinished", [None, 2])
async def test_offline_loop_answers_as_the_actor_graph(default_model_path, batch_requests, max_unfinished):
    engine = make_engine(default_model_path, num_kv_blocks=64, max_num_batched_tokens=128, max_num_seqs=4)
    graph = await run_embedded(engine, batch_requests, tqdm(disable=True))
    progress = _Counter()
    ours = run_offline(engine, batch_requests, progress, max_unfinished=max_unfinished)
    assert progress.n == len(batch_requests)
    _assert_same_results(ours, graph)
    errors = {request_id: r["error"]["message"] for request_id, r in ours.items() if r["error"] is not None}
    assert len(errors) == 2 and any("limit is" in m for m in errors.values())
    assert any("prompt_token_ids[1] must be an int" in m for m in errors.values())
    assert not engine.has_unfinished and engine.scheduler.kv_cache.pool.num_free_blocks == 64
    by_body = dict(zip(BODIES, (ours[request.id] for request in batch_requests), strict=True))
    assert {choice["text"] for choice in by_body["guided-choice"]["choices"]} <= {"north", "south"}
    assert len(by_body["guided-regex"]["choices"][0]["text"]) == 4


def test_offline_loop_fails_loudly_when_the_engine_schedules_nothing(default_model_path, batch_requests):
    engine = make_engine(default_model_path, num_kv_blocks=64)
    engine.scheduler.schedule = lambda: type("Empty", (), {"is_empty": True})()  # a wedged scheduler
    with pytest.raises(RuntimeError, match="scheduled nothing"):
        run_offline(engine, batch_requests[:1], tqdm(disable=True))


def test_offline_loop_stops_after_the_step_in_which_stop_is_set(default_model_path, batch_requests):
    import threading

    engine = make_engine(default_model_path, num_kv_blocks=64, max_num_seqs=2)
    stop = threading.Event()

    class StopAfterTwo(_Counter):
        def update(self, count: int) -> None:
            super().update(count)
            if self.n >= 2:
                stop.set()  # what Ctrl-C does in the CLI

    results = run_offline(engine, batch_requests, StopAfterTwo(), stop=stop)
    assert 2 <= len(results) < len(batch_requests)
    assert engine.has_unfinished  # the rest was never run to the end
