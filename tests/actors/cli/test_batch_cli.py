"""`aqueduct batch` end to end on the built-in model: output shape, errors per line, order."""

from __future__ import annotations

import json

import pytest

from actors.cli.main import main


def _line(custom_id, body, **envelope):
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body, **envelope})


@pytest.mark.parametrize("runner", [[], ["--actor-graph"]], ids=["engine-loop", "actor-graph"])
def test_batch_file_round_trip_with_bad_lines(tmp_path, default_model_path, monkeypatch, runner):
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
    lines = [
        _line("greedy", {"prompt": "The river", "max_tokens": 5, "temperature": 0}),
        "this is not json",
        _line("typo", {"prompt": "x", "temprature": 0.5}),
        _line("ids", {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": True, "logprobs": 2}),
        _line("too-long", {"prompt": list(range(1, 3000)), "max_tokens": 3}),
        _line("bad-id", {"prompt": [1, 99999], "max_tokens": 3}),
        _line("n2", {"prompt": "Water", "max_tokens": 4, "n": 2, "seed": 3, "ignore_eos": True}),
        _line("greedy", {"prompt": "duplicate id", "max_tokens": 2}),
        _line("wrong-url", {"prompt": "x"}, url="/v1/embeddings"),
    ]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    assert main(["batch", "-i", str(source), "-o", str(target), "--no-progress", "--num-kv-blocks", "256",
                 "--model", "builtin", *runner]) == 0
    results = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == ["greedy", "line-2", "typo", "ids", "too-long", "bad-id", "n2",
                                                 "greedy", "wrong-url"]
    ok = {r["custom_id"]: r for r in results if r["error"] is None}
    assert set(ok) == {"greedy", "ids", "n2"}
    errors = {r["custom_id"]: r["error"]["message"] for r in results if r["error"] is not None}
    assert "temprature" in errors["typo"]
    assert "limit is" in errors["too-long"]
    assert "prompt_token_ids[1] must be an int in [0, 4096)" in errors["bad-id"]
    assert "duplicate custom_id" in errors["greedy"]
    assert "url must be /v1/completions or /v1/chat/completions" in errors["wrong-url"]
    assert results[1]["response"]["status_code"] == 400

    ids = ok["ids"]["response"]["body"]
    [choice] = ids["choices"]
    assert len(choice["token_ids"]) == 3 and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["token_logprobs"]) == 3
    assert all(len(top) == 2 for top in choice["logprobs"]["top_logprobs"])
    assert ids["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
                            "prompt_tokens_details": {"cached_tokens": 0}}
    n2 = ok["n2"]["response"]["body"]["choices"]
    assert [c["index"] for c in n2] == [0, 1] and all(len(c["token_ids"]) == 4 for c in n2)
    assert ok["greedy"]["response"]["body"]["choices"][0]["text"] is not None


def test_batch_runs_all_torch_work_on_one_device_thread(tmp_path, default_model_path, monkeypatch):
    """Model loading and every forward share one thread (actors/kit/device.py says why: OpenMP spin-waits
    only while a single thread starts parallel regions)."""
    import threading

    from pipeline.model.runner import ModelRunner

    threads: dict[str, set[int]] = {"load": set(), "forward": set()}
    real_init, real_execute = ModelRunner.__init__, ModelRunner.execute

    def init(self, *args, **kwargs):
        threads["load"].add(threading.get_ident())
        real_init(self, *args, **kwargs)

    def execute(self, inputs):
        threads["forward"].add(threading.get_ident())
        return real_execute(self, inputs)

    monkeypatch.setattr(ModelRunner, "__init__", init)
    monkeypatch.setattr(ModelRunner, "execute", execute)
    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(_line(f"r{i}", {"prompt": [5, 6, 7 + i], "max_tokens": 3}) for i in range(4)))
    assert main(["batch", "-i", str(source), "-o", str(target), "--no-progress", "--num-kv-blocks", "64",
                 "--model", "builtin"]) == 0
    assert len(target.read_text().splitlines()) == 4
    assert threads["load"] == threads["forward"] and len(threads["load"]) == 1
    assert threads["load"] != {threading.get_ident()}


def test_chat_lines_render_the_chat_template_and_get_chat_completion_bodies(tmp_path, default_model_path,
                                                                            monkeypatch):
    from pipeline.loading.tokenizer import load_hf_tokenizer

    monkeypatch.setenv("AQUEDUCT_CACHE_DIR", str(default_model_path.parent))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The river"}]
    rendered = load_hf_tokenizer(default_model_path).apply_chat_template(messages, tokenize=False,
                                                                       add_generation_prompt=True)
    chat_url = {"url": "/v1/chat/completions"}
    lines = [
        _line("chat", {"messages": messages, "max_completion_tokens": 6, "temperature": 0, "ignore_eos": True,
                       "logprobs": True, "top_logprobs": 2}, **chat_url),
        # The same prompt as text: the builtin tokenizer adds no special tokens, so the tokens are equal.
        _line("as-text", {"prompt": rendered, "max_tokens": 6, "temperature": 0, "ignore_eos": True}),
        _line("tools", {"messages": messages, "tools": [{"type": "function", "function": {"name": "f"}}]},
              **chat_url),
        # An image part for a text-only model (text parts alone are joined into one string).
        _line("parts", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
            "max_tokens": 2}, **chat_url),
        _line("no-messages", {"prompt": "x"}, **chat_url),
        _line("int-logprobs", {"messages": messages, "logprobs": 2}, **chat_url),
        # JSON object keys are strings; +100 outweighs any logit of the builtin model.
        _line("biased", {"messages": messages, "max_tokens": 3, "temperature": 0, "ignore_eos": True,
                         "logit_bias": {"65": 100}}, **chat_url),
    ]
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(lines) + "\n")
    assert main(["batch", "-i", str(source), "-o", str(target), "--no-progress", "--num-kv-blocks", "64",
                 "--model", "builtin"]) == 0
    results = {r["custom_id"]: r for r in map(json.loads, target.read_text().splitlines())}

    chat = results["chat"]["response"]["body"]
    text = results["as-text"]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["id"] == "chatcmpl-chat" and chat["model"] == "builtin"
    [choice] = chat["choices"]
    assert choice["message"] == {"role": "assistant", "content": text["choices"][0]["text"]}
    assert choice["token_ids"] == text["choices"][0]["token_ids"] and choice["finish_reason"] == "length"
    assert chat["usage"]["prompt_tokens"] == text["usage"]["prompt_tokens"]
    content = choice["logprobs"]["content"]
    assert len(content) == 6 and all(len(entry["top_logprobs"]) == 2 for entry in content)
    assert set(content[0]) == {"token", "logprob", "bytes", "top_logprobs"}
    assert content[0]["bytes"] == list(content[0]["token"].encode("utf-8"))

    assert results["biased"]["response"]["body"]["choices"][0]["token_ids"] == [65, 65, 65]

    errors = {custom_id: r["error"]["message"] for custom_id, r in results.items() if r["error"] is not None}
    assert set(errors) == {"tools", "parts", "no-messages", "int-logprobs"}
    assert "--tool-call-parser" in errors["tools"]  # tools with auto choice need the parser flags
    assert "images: this model takes no images" in errors["parts"]
    assert "body.messages is required" in errors["no-messages"]
    assert "logprobs must be true or false" in errors["int-logprobs"]
