"""Intake: a client's prompt and parameters -> a validated Request (tokenized, seeded, checked).

Every rejection is a ValueError whose message names the field and the rule; the caller turns
it into an error reply. Nothing here touches scheduler state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.config import RequestLimits
from pipeline.grammar.compiler import GrammarCompiler
from pipeline.intake.chat_content import ChatContentGuard
from pipeline.intake.image_processor import ImageProcessor
from pipeline.lora.registry import LoRARegistry
from pipeline.request.chat_template_kwargs import check_chat_template_kwargs
from pipeline.request.generation_defaults import GenerationDefaults
from pipeline.request.image_input import ImageInput, VisionInfo, check_image_count, expand_placeholders
from pipeline.request.request import Request
from pipeline.request.sampling_params import SamplingParams
from pipeline.sampling.dry import SequenceBreakers
from pipeline.sampling.rng import request_seed


class RequestBuilder:
    def __init__(self, tokenizer: Any | None, vocab_size: int, eos_token_ids: frozenset[int],
                 max_model_len: int, *, max_logprobs: int = 20, vision: VisionInfo | None = None,
                 image_processor: ImageProcessor | None = None, loras: LoRARegistry | None = None,
                 base_model_names: frozenset[str] = frozenset(),
                 breakers: SequenceBreakers | None = None, content_guard: ChatContentGuard | None = None,
                 grammars: GrammarCompiler | None = None, limits: RequestLimits | None = None,
                 seed: int | None = None, generation_defaults: GenerationDefaults | None = None) -> None:
        self.limits = limits or RequestLimits()
        # The model's generation_config.json sampling defaults (--generation-config), for wire params.
        self.generation_defaults = generation_defaults or GenerationDefaults()
        self.seed = seed  # --seed: mixed into the seed a request without one derives from its id
        self.tokenizer = tokenizer
        self.grammars = grammars  # the scheduler's: a grammar compiled here is one it finds cached
        self.content_guard = content_guard  # None: special-token text in messages is read as special tokens
        self.breakers = breakers  # the sampler's: a mask built here is one the device thread finds
        self.vision = vision  # None: a text-only model
        self.image_processor = image_processor
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.max_logprobs = max_logprobs
        self.loras = loras
        self.base_model_names = base_model_names  # a `lora` naming the base model means no adapter

    def sampling_params(self, wire_params: dict[str, Any]) -> SamplingParams:
        """A request's wire params, the model's defaults filled in for the fields it left out."""
        if not self.generation_defaults:
            return SamplingParams.from_dict(wire_params)
        return SamplingParams.from_dict(self.generation_defaults.apply(wire_params))

    def build(self, request_id: str, params: SamplingParams, *, prompt: str | None = None,
              prompt_token_ids: Sequence[int] | None = None,
              messages: list[dict[str, Any]] | None = None, images: Sequence[bytes] | None = None,
              lora: str | None = None, tools: list[dict[str, Any]] | None = None,
              chat_template_kwargs: dict[str, Any] | None = None, priority: int = 0,
              tenant: str | None = None, tenant_weight: float = 1.0) -> Request:
        """`tools` (OpenAI's, with `messages` only) are rendered by the chat template, as transformers'
        apply_chat_template(tools=...) does; `chat_template_kwargs` are the template's extra variables."""
        if self.breakers is not None and params.dry_multiplier > 0:
            self.breakers.mask(params.dry_sequence_breakers)  # built here, not on the device thread
        if params.structured_outputs is not None:
            self._compile_grammar(params)
        given = [name for name, value in (("prompt", prompt), ("prompt_token_ids", prompt_token_ids),
                                          ("messages", messages)) if value is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of prompt, prompt_token_ids, messages is required, got {given or 'none'}")
        if images and self.vision is None:
            raise ValueError("images: this model takes no images (it is not a vision-language model)")
        if tools is not None and messages is None:
            raise ValueError("tools need messages (they are rendered by the chat template)")
        if chat_template_kwargs is not None:
            self._check_template_kwargs(chat_template_kwargs, messages)
        prompt, ids = self.rendered_prompt(prompt, prompt_token_ids, messages, tools, chat_template_kwargs)
        image_inputs: list[ImageInput] = []
        if self.vision is not None:
            ids, image_inputs = self._expand_images(ids, images or [], params)
        if params.truncate_prompt_tokens is not None:
            ids = ids[-params.truncate_prompt_tokens:]  # the last k tokens, as vLLM
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens; the limit is {self.max_model_len - 1} "
                             f"(max_model_len {self.max_model_len} incl. one output token)")
        params = self._capped(params, len(ids))
        self._check_params(params, len(ids))
        lora_id = self._lora_id(lora)
        return Request(request_id=request_id, prompt_token_ids=ids, params=params,
                       seed=self._seed(params, request_id), eos_token_ids=self.eos_token_ids,
                       prompt=prompt, images=tuple(image_inputs), lora_name=lora if lora_id is not None else None,
                       lora_id=lora_id, priority=priority, tenant=tenant, tenant_weight=tenant_weight)

    def rendered_prompt(self, prompt: str | None, prompt_token_ids: Sequence[int] | None,
                        messages: list[dict[str, Any]] | None, tools: list[dict[str, Any]] | None = None,
                        chat_template_kwargs: dict[str, Any] | None = None,
                        max_chars: int | None = None) -> tuple[str | None, list[int]]:
        """(the prompt text, its token ids) from exactly one of the three inputs: messages through the
        chat template, text tokenized, ids checked. Image placeholders are not expanded yet. Entry
        points call this too, to name a prompt's blocks as the workers will (queue_adapters/placement.py),
        with `max_chars`: only that much of the text is tokenized (the last ids may then differ from
        the whole text's, where a token spans the cut)."""
        literals: list[str] = []
        if messages is not None:
            chat = self._chat_messages(messages)
            if self.content_guard is not None:
                chat, tools, literals = self.content_guard.protect_with_tools(chat, tools)
            prompt = self._apply_chat_template(chat, tools, chat_template_kwargs or {})
        if prompt is not None and max_chars is not None:
            prompt = prompt[:max_chars]
        if prompt is not None and literals:
            assert self.content_guard is not None
            self._check_prompt_chars(prompt)
            return prompt, self.content_guard.encode(prompt, literals)  # special-token text in messages stays text
        if prompt is not None:
            # A rendered template already holds the special tokens the model wants (BOS included), as
            # in HF's apply_chat_template(tokenize=True); adding them again would double the BOS.
            return prompt, self._tokenize(prompt, add_special_tokens=messages is None)
        return None, self._check_ids(prompt_token_ids or [])

    def _seed(self, params: SamplingParams, request_id: str) -> int:
        if params.seed is not None or self.seed is None:
            return request_seed(params.seed, request_id)
        return request_seed(None, f"{request_id}\x00{self.seed}")  # every worker of a deployment: the same

    def _check_limits(self, params: SamplingParams) -> None:
        limits = self.limits
        for name, flag, most, given in (
                ("stop", "--max-stop-strings", limits.max_stop_strings, len(params.stop)),
                ("dry_sequence_breakers", "--max-dry-breakers", limits.max_dry_breakers,
                 len(params.dry_sequence_breakers) if params.dry_multiplier > 0 else 0),
                ("logit_bias", "--max-logit-bias", limits.max_logit_bias, len(params.logit_bias)),
                ("custom_token_bans", "--max-token-bans", limits.max_token_bans, len(params.custom_token_bans))):
            if given > most:
                raise ValueError(f"{name} may hold at most {most} items on this server ({flag}), got {given}")

    def _compile_grammar(self, params: SamplingParams) -> None:
        """Compiled here (the intake actor runs this in a worker thread), so the scheduler only makes
        matchers from a cached grammar; a constraint that does not compile is this request's error."""
        if self.grammars is None:
            raise ValueError("structured outputs need the model's tokenizer, and this model has none")
        assert params.structured_outputs is not None
        self.grammars.compile(params.structured_outputs)

    def _lora_id(self, name: str | None) -> int | None:
        if name is None or name in self.base_model_names:
            return None
        if self.loras is None:
            raise ValueError(f"lora: unknown adapter {name!r} (LoRA is not enabled on this worker: "
                             "start it with --lora-modules or --enable-lora)")
        return self.loras.id_of(name)

    def _expand_images(self, ids: list[int], images: Sequence[bytes],
                       params: SamplingParams) -> tuple[list[int], list[ImageInput]]:
        """Decode the images and expand their placeholders (pipeline/request/image_input.py)."""
        assert self.vision is not None and self.image_processor is not None
        if images and params.truncate_prompt_tokens is not None:
            raise ValueError("truncate_prompt_tokens cannot be used with images (it could cut an image in two)")
        check_image_count(ids, len(images), self.vision)  # before the work of decoding them
        pixels = [self.image_processor(data, f"images[{index}]") for index, data in enumerate(images)]
        return expand_placeholders(ids, pixels, self.vision)

    def _chat_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return template_messages(messages, vision=self.vision is not None)

    def _capped(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """max_tokens under the model's max_new_tokens (--generation-config), as vLLM's server-wide limit."""
        room = self.max_model_len - num_prompt_tokens
        max_tokens = self.generation_defaults.capped_max_tokens(params.max_tokens, room)
        return params if max_tokens == params.max_tokens else dataclasses.replace(params, max_tokens=max_tokens)

    def _check_params(self, params: SamplingParams, num_prompt_tokens: int) -> None:
        """The rules that need the model or the deployment: context left for the output, vocabulary,
        --max-logprobs, the request limits."""
        self._check_limits(params)
        room = self.max_model_len - num_prompt_tokens
        if params.max_tokens is not None and params.max_tokens > room:
            raise ValueError(f"max_tokens must be <= {room} (max_model_len {self.max_model_len} minus the "
                             f"prompt's {num_prompt_tokens} tokens), got {params.max_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.max_logprobs:
                raise ValueError(f"{name} must be in [0, {self.max_logprobs}] or None (--max-logprobs), got {value}")
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("custom_token_bans", params.custom_token_bans),
                          ("logit_bias", [token_id for token_id, _ in params.logit_bias])):
            outside = [token_id for token_id in ids if token_id >= self.vocab_size]
            if outside:
                raise ValueError(f"{name} must hold token ids in [0, {self.vocab_size}), got {outside[0]}")

    def _check_template_kwargs(self, kwargs: dict[str, Any], messages: list[dict[str, Any]] | None) -> None:
        if messages is None:
            raise ValueError("chat_template_kwargs need messages (they are the chat template's variables)")
        check_chat_template_kwargs(kwargs)
        special = self.content_guard.special_text_in(kwargs) if self.content_guard is not None else None
        if special is not None:  # the template would write it into the prompt, where it reads as the token
            raise ValueError(f"chat_template_kwargs: special-token text {special!r} is not accepted in template "
                             "variables")

    def _apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                             kwargs: dict[str, Any]) -> str:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("messages need a chat template, and this model's tokenizer has none")
        if not messages:
            raise ValueError("messages must not be empty")
        try:
            with_tools = {"tools": tools} if tools is not None else {}
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                      **with_tools, **kwargs)
        except Exception as error:
            # The template is model-supplied Jinja run on the client's messages: any failure (e.g.
            # jinja2's TemplateError from raise_exception("roles must alternate")) is a bad request.
            raise ValueError(f"messages: the model's chat template rejected them: {error}") from error

    def _tokenize(self, prompt: str, add_special_tokens: bool) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: send prompt_token_ids instead of text")
        if not prompt:
            raise ValueError("prompt must not be empty")
        self._check_prompt_chars(prompt)
        if add_special_tokens:
            return list(self.tokenizer.encode(prompt))
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    def _check_prompt_chars(self, prompt: str) -> None:
        """Refused before tokenizing: a 20 MB prompt takes the tokenizer seconds, to learn it cannot fit."""
        most_chars = self.max_model_len * self.limits.max_prompt_chars_per_token
        if len(prompt) > most_chars:
            raise ValueError(f"prompt has {len(prompt)} characters; at most {most_chars} are accepted "
                             f"(max_model_len {self.max_model_len} x {self.limits.max_prompt_chars_per_token}, "
                             "--max-prompt-chars-per-token)")

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        ids = list(ids)
        if not ids:
            raise ValueError("prompt_token_ids must not be empty")
        for position, token_id in enumerate(ids):
            if not isinstance(token_id, int | np.integer) or isinstance(token_id, bool) \
                    or not 0 <= token_id < self.vocab_size:
                raise ValueError(f"prompt_token_ids[{position}] must be an int in [0, {self.vocab_size}), "
                                 f"got {token_id!r}")
        return [int(t) for t in ids]


def template_messages(messages: list[dict[str, Any]], *, vision: bool) -> list[dict[str, Any]]:
    """Content parts as chat templates take them: a vision model's template gets a list of
    {type: text, text} / {type: image} parts; a text model's gets the text parts joined."""
    rendered = []
    for index, message in enumerate(messages):
        content = message["content"]
        if vision:
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
            rendered.append({**message, "content": parts})
        elif isinstance(content, str):
            rendered.append(message)
        else:
            if any(part["type"] == "image" for part in content):
                raise ValueError(f"messages[{index}].content: image parts need a vision-language model; "
                                 "this model takes text only")
            rendered.append({**message, "content": "\n".join(part["text"] for part in content)})
    return rendered
