"""Reasoning at the gateway, whatever the protocol: a reasoning model's answer split into its reasoning
(`<think>` ... `</think>`, or from the answer's start when the prompt opened it; gpt-oss's `analysis`
channel) and the content after it. Each protocol renders the two parts its own way (OpenAI chat:
`reasoning` and `reasoning_content`, actors/http/openai/render.py and chunks.py).

- formats.py: the parsers of `--reasoning-parser` (vLLM's names: `deepseek_r1`, `qwen3`, `gpt_oss`;
  and `think`, the generic one) and what a request makes of the server's parser (thinking switched
  off, a structured-output constraint, the special tokens gpt_oss needs in the text);
- splitter.py: the split, piece by piece as a stream comes in, holding back what may still become a
  marker; a whole answer is split by the same machine fed once, so a stream reassembles to it;
- harmony.py: gpt_oss's machine behind the same interface, harmony messages split by their channel;
- split.py: one piece's reasoning and content.

May import: nothing (text only: the protocols import it, not the other way round).
"""

from __future__ import annotations

from actors.http.reasoning.formats import FORMATS, ReasoningFormat, decode_params, format_for_request
from actors.http.reasoning.splitter import ReasoningSplitter, Split, split_whole

__all__ = ["FORMATS", "ReasoningFormat", "ReasoningSplitter", "Split", "decode_params", "format_for_request",
           "split_whole"]
