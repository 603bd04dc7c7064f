"""Tool calling in batch files, as `aqueduct serve` answers it: `required` and a named function always give
calls that parse (structured outputs), `auto` needs --enable-auto-tool-choice --tool-call-parser, and an
earlier turn's calls and results are history the template renders."""

from __future__ import annotations

import json
from pathlib import Path

from actors.cli.main import main

CITY = {"type": "object", "additionalProperties": False, "required": ["city"],
        "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}}}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": CITY}},
         {"type": "function", "function": {"name": "time", "parameters": CITY}}]
USER = [{"role": "user", "content": "Weather in Oslo?"}]
HISTORY = [*USER, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]


def _chat(custom_id: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"max_tokens": 300, "temperature": 1.0, "seed": 3, **body}})


def _run(tmp_path: Path, default_model_path: Path, lines: list[str], *flags: str) -> dict[str, dict]:
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    assert main(["batch", "-i", str(source), "-o", str(target), "--no-progress", "--num-kv-blocks", "256",
                 "--model", str(default_model_path), "--dtype", "float32", "--quantization", "none", *flags]) == 0
    return {record["custom_id"]: record for record in map(json.loads, target.read_text().splitlines())}


def test_required_and_named_calls_parse_and_auto_needs_a_parser(tmp_path, default_model_path, monkeypatch):
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
    results = _run(tmp_path, default_model_path, [
        _chat("required", messages=USER, tools=TOOLS, tool_choice="required", parallel_tool_calls=False),
        _chat("named", messages=USER, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "time"}}),
        _chat("auto", messages=USER, tools=TOOLS),
        _chat("history", messages=HISTORY, tools=TOOLS, tool_choice="none", max_tokens=4),
    ])
    for custom_id in ("required", "named"):
        choice = results[custom_id]["response"]["body"]["choices"][0]
        calls = choice["message"]["tool_calls"]
        assert calls and all(call["function"]["name"] in ("weather", "time") for call in calls), custom_id
        assert all(json.loads(call["function"]["arguments"])["city"] in ("Oslo", "Rome") for call in calls)
    assert results["named"]["response"]["body"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] \
        == "time"
    assert results["auto"]["error"] is not None and "--tool-call-parser" in results["auto"]["error"]["message"]
    assert results["history"]["error"] is None
    assert "tool_calls" not in results["history"]["response"]["body"]["choices"][0]["message"]


def test_auto_with_the_parser_flags_is_accepted_and_the_flag_alone_is_an_error(tmp_path, default_model_path,
                                                                               monkeypatch):
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
    results = _run(tmp_path, default_model_path, [_chat("auto", messages=USER, tools=TOOLS, max_tokens=4)],
                   "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    assert results["auto"]["error"] is None
    assert main(["batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "x.jsonl"), "--no-progress",
                 "--model", str(default_model_path), "--enable-auto-tool-choice"]) == 2
