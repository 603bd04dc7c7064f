"""Chat templates in three model families' tool-calling styles, written for the tests (Hermes/Qwen,
Llama 3.1, Mistral), and an engine of the built-in model that renders with one of them.

Each renders `tools` and the two tool-calling message kinds the way its family does: an assistant
message's `tool_calls` (arguments as an object, which Mistral's style iterates key by key) and a
`tool` message answering one call."""

from __future__ import annotations

from pathlib import Path

from pipeline.engine import LLMEngine
from tests.support.engine_helpers import make_engine

HERMES = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You may call one or more functions. Their signatures are in <tools></tools>:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Answer a call as <tool_call>{"name": <name>, "arguments": <object>}</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' %}<|im_start|>assistant
{%- if message.content %}
{{ message.content }}{% endif %}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role != 'system' %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

LLAMA3 = """\
<|begin_of_text|>
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
Given the following functions, answer with a JSON call {"name": function name, "parameters": arguments}.
{% for tool in tools %}{{ tool | tojson(indent=4) }}

{% endfor %}<|eot_id|>
{%- endif %}
{%- for message in messages %}<|start_header_id|>{{ 'ipython' if message.role == 'tool' else message.role }}\
<|end_header_id|>

{% if message.tool_calls %}{% for call in message.tool_calls %}<|python_tag|>{"name": "{{ call.function.name }}", \
"parameters": {{ call.function.arguments | tojson }}}{% endfor %}<|eom_id|>
{%- elif message.role == 'tool' %}{{ message.content }}<|eot_id|>
{%- else %}{{ message.content }}<|eot_id|>{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MISTRAL = """\
<s>{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' or message.role == 'system' %}[INST]{{ message.content }}[/INST]
{%- elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS][
{%- for call in message.tool_calls %}{"name": "{{ call.function.name }}", "arguments": {
{%- for key, value in call.function.arguments.items() %}"{{ key }}": {{ value | tojson }}\
{%- if not loop.last %}, {% endif %}{% endfor %}}, "id": "{{ call.id }}"}
{%- if not loop.last %}, {% endif %}{% endfor %}]</s>
{%- elif message.role == 'assistant' %}{{ message.content }}</s>
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{"call_id": "{{ message.tool_call_id }}", \
"content": {{ message.content | tojson }}}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}"""

TEMPLATES = {"hermes": HERMES, "llama3_json": LLAMA3, "mistral": MISTRAL}  # by the parser of their format


def engine_with_template(model_dir: Path, chat_template: str) -> LLMEngine:
    return make_engine(model_dir, chat_template=chat_template)
