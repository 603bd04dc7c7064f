"""A batch line's body may carry vLLM's `priority`; it travels on the line's wire request."""

import json

from actors.cli.batch import read_batch_file


def test_batch_lines_carry_their_priority_and_bad_ones_are_line_errors(tmp_path):
    lines = [
        {"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 1, "priority": 7}},
        {"custom_id": "b", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "x"}], "priority": -2}},
        {"custom_id": "c", "url": "/v1/completions", "body": {"prompt": "x"}},
        {"custom_id": "d", "url": "/v1/completions", "body": {"prompt": "x", "priority": "high"}},
    ]
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    parsed = {line.custom_id: line for line in read_batch_file(path)}
    assert [parsed[name].request.priority for name in "abc"] == [7, -2, 0]
    assert parsed["d"].request is None and "priority must be an integer" in parsed["d"].error
