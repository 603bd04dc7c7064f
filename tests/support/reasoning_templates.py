"""A chat template in Qwen3's thinking style, written for the tests: with `enable_thinking: false` it
closes an empty think block in the prompt (so the model answers without reasoning), and it names
`reasoning_effort` in a system line when given."""

from __future__ import annotations

THINKING = """\
{%- if reasoning_effort is defined %}<|im_start|>system
Reasoning: {{ reasoning_effort }}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""

THINKING_OFF_SUFFIX = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
