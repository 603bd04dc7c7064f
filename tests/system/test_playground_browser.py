"""The playground page (`GET /`) in a real headless Chromium, against `aqueduct serve --model builtin` run
as a user would: type a prompt, click Send, watch the answer stream in, read the usage line."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.browser import find_chromium, headless_page
from tests.support.gateway_helpers import free_port

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary found (apt-get install chromium, "
                                                          "or set AQUEDUCT_CHROMIUM)")]
MAX_TOKENS = 16
PROMPT = "Tell me about aqueducts"

# Records every text the assistant's turn shows, in order: each `textContent =` adds one text node.
RECORD_TEXTS = """
window.shown = [];
new MutationObserver((records) => {
  for (const record of records)
    for (const node of record.addedNodes)
      if (node.nodeType === Node.TEXT_NODE && node.parentElement.closest('.assistant'))
        window.shown.push([performance.now(), node.data]);
}).observe(document.getElementById('log'), { childList: true, subtree: true });
true
"""


@pytest.fixture(scope="module")
def served_url(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`aqueduct serve --model builtin` (embedded) as a process on a free port."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "AQUEDUCT_CACHE_DIR": str(default_model_path.parent)}
    command = [sys.executable, "-m", "actors.cli.main", "serve", "--model", "builtin",
               "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _healthy(url):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _greedy_reply(url: str, model: str) -> tuple[str, int]:
    """What the page must show: the non-streamed greedy answer to the same chat, and its token count."""
    body = {"model": model, "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
            "max_tokens": MAX_TOKENS}
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()
    return answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"]


async def test_typed_prompt_streams_the_greedy_answer_and_fills_the_usage_line(served_url: str) -> None:
    assert CHROMIUM is not None
    async with headless_page(CHROMIUM, served_url + "/") as page:
        model = await page.wait_for("document.getElementById('model').value")
        expected_text, expected_tokens = _greedy_reply(served_url, model)
        assert expected_tokens == MAX_TOKENS and expected_text  # long enough to arrive in several pieces
        await page.evaluate(f"document.getElementById('temperature').value = '0'; "
                            f"document.getElementById('max_tokens').value = '{MAX_TOKENS}'")
        assert await page.evaluate(RECORD_TEXTS)
        await page.click("#prompt")
        await page.type_text(PROMPT)
        await page.click("#send")
        stats = await page.wait_for("document.getElementById('stats').textContent", timeout_s=300)
        shown = await page.evaluate("window.shown")
        user_turn = await page.evaluate("document.querySelector('.turn.user span:last-child').textContent")

    assert user_turn == PROMPT
    # A chunk may add no text (the role chunk, the finish chunk): keep the first time each text was shown.
    growth = [(at, text) for index, (at, text) in enumerate(shown)
              if text and (index == 0 or text != shown[index - 1][1])]
    texts = [text for _, text in growth]
    assert texts[-1] == expected_text
    # Streamed, not delivered at once: several growing texts, each extending the one before, over time.
    assert len(texts) >= 3, texts
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
    times = [at for at, _ in growth]
    assert times == sorted(times) and times[-1] > times[0]
    usage = re.fullmatch(r"prompt (\d+) tokens · completion (\d+) tokens · first token [\d.]+ s · "
                         r"[\d.]+ s · [\d.]+ tokens/s", stats)
    assert usage is not None, stats
    assert int(usage.group(1)) > 0 and int(usage.group(2)) == expected_tokens
