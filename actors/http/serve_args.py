"""`aqueduct serve`'s flags (apart from the engine's), kept free of the web stack so the CLI starts fast."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from typing import Any

from actors.http.options import BatchOptions, GatewayOptions
from actors.http.reasoning import FORMATS
from actors.http.tenancy.api_keys import ApiKeys, load_api_keys
from actors.http.tool_parsers import PARSERS
from pipeline.request.chat_template_kwargs import check_chat_template_kwargs
from pipeline.request.untrusted import loads_json

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def add_serve_args(parser: argparse.ArgumentParser, env_default: Callable[..., str | None]) -> None:
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="the model, as vLLM's `serve MODEL` takes it (the same as --model)")
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="the model's names in the API: the first is what responses report, every one is "
                             "accepted as `model` (default: the model's own name)")
    parser.add_argument("--allowed-origins", nargs="+", default=None, metavar="ORIGIN",
                        help="browser origins allowed by CORS, e.g. https://example.com or * (default: none)")
    parser.add_argument("--root-path", default="", help="the path prefix a proxy serves this API under")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: this host only; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--redis-url", default=env_default("AQUEDUCT_REDIS_URL"),
                        help="be a stateless gateway in front of the workers of this deployment "
                             "(default: run the engine in this process)")
    parser.add_argument("--prefix", default=env_default("AQUEDUCT_PREFIX", "aqueduct"), help="deployment key prefix")
    parser.add_argument("--placement", choices=("prefix", "any"), default="prefix",
                        help="gateway: offer each request to the worker caching the longest prefix of its prompt "
                             "(prefix), or queue every request for any worker (any); docs/deployment.md#placement")
    parser.add_argument("--api-key", default=env_default("AQUEDUCT_API_KEY"),
                        help="require Authorization: Bearer KEY (env AQUEDUCT_API_KEY)")
    parser.add_argument("--api-keys", default=env_default("AQUEDUCT_API_KEYS"), metavar="FILE",
                        help="require one of the keys in FILE, lines `key,tenant[,weight]`: each key's requests "
                             "are its tenant's, for fair share (env AQUEDUCT_API_KEYS; not with --api-key)")
    parser.add_argument("--max-pending", type=int, default=256, help="requests in flight before answering 429")
    parser.add_argument("--worker-timeout", type=float, default=60.0,
                        help="seconds to wait for a worker's first reply before answering 503")
    parser.add_argument("--request-timeout", type=float, default=None,
                        help="seconds a request may run (sent as the wire deadline); default: no limit")
    parser.add_argument("--max-request-bytes", type=int, default=4 * 1024 * 1024, help="larger bodies get 413")
    parser.add_argument("--strict-fields", action="store_true",
                        help="answer an unknown request field with a 400 (default: ignore it, log it and name it "
                             "in the X-Ignored-Fields response header, as vLLM accepts extra fields)")
    add_tool_args(parser)
    add_reasoning_args(parser)
    parser.add_argument("--metrics-open", action="store_true",
                        help="serve /metrics without the API key (by default it needs --api-key when one is set)")
    add_runtime_lora_args(parser)
    add_batch_args(parser)


def add_batch_args(parser: argparse.ArgumentParser) -> None:
    """The Batch API's bounds (/v1/files, /v1/batches: docs/deployment.md#batches)."""
    defaults = BatchOptions()
    parser.add_argument("--batch-max-file-bytes", type=int, default=defaults.max_file_bytes, metavar="BYTES",
                        help="the largest file /v1/files takes (larger: 413)")
    parser.add_argument("--batch-max-lines", type=int, default=defaults.max_lines, metavar="N",
                        help="the most requests a batch's input file may hold (more: 400)")
    parser.add_argument("--batch-max-in-flight", type=int, default=defaults.max_in_flight, metavar="N",
                        help="lines of one batch submitted to the workers and not yet answered")
    parser.add_argument("--batch-max-running", type=int, default=defaults.max_running, metavar="N",
                        help="batches this gateway runs at once; later ones wait their turn")


def batch_options_from_args(args: argparse.Namespace) -> BatchOptions:
    """ValueError naming the flag for a bound below 1."""
    values = {"max_file_bytes": args.batch_max_file_bytes, "max_lines": args.batch_max_lines,
              "max_in_flight": args.batch_max_in_flight, "max_running": args.batch_max_running}
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"--batch-{name.replace('_', '-')} must be >= 1, got {value}")
    return BatchOptions(**values)


def add_runtime_lora_args(parser: argparse.ArgumentParser) -> None:
    """vLLM's runtime LoRA routes (docs/lora.md#loading-adapters-over-http)."""
    parser.add_argument("--enable-runtime-lora-updating", action="store_true",
                        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter, behind the API key "
                             f"(also on with env {RUNTIME_LORA_ENV}=true, as vLLM); off, they answer 404")
    parser.add_argument("--lora-root", default=None, metavar="DIR",
                        help="adapters loaded over HTTP must lie under DIR (symlinks resolved); unset, any "
                             "directory this server can read (a warning says so)")


def runtime_lora_updating(args: argparse.Namespace, environ: Mapping[str, str]) -> bool:
    """The flag, or vLLM's switch: VLLM_ALLOW_RUNTIME_LORA_UPDATING=true or 1 (any case)."""
    return args.enable_runtime_lora_updating or environ.get(RUNTIME_LORA_ENV, "").strip().lower() in ("true", "1")


def add_tool_args(parser: argparse.ArgumentParser) -> None:
    """vLLM's tool-calling flags (serve and batch)."""
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help='serve tool_choice "auto": the model\'s text becomes tool_calls through '
                             "--tool-call-parser (without it, auto with tools is a 400, as in vLLM)")
    parser.add_argument("--tool-call-parser", choices=sorted(PARSERS), default=None,
                        help="the model's tool-call format, for --enable-auto-tool-choice")


def add_reasoning_args(parser: argparse.ArgumentParser) -> None:
    """vLLM's reasoning flags (docs/http-api.md#reasoning)."""
    parser.add_argument("--reasoning-parser", choices=sorted(FORMATS), default=None,
                        help="split chat answers' reasoning (<think>...</think>, gpt-oss's analysis channel) from "
                             "their content into `reasoning` and `reasoning_content`, in the model's format")
    parser.add_argument("--default-chat-template-kwargs", default=None, metavar="JSON",
                        help='the chat template\'s variables for every chat request, e.g. \'{"enable_thinking": '
                             "false}'; a request's chat_template_kwargs override them")


def template_kwargs_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """--default-chat-template-kwargs as a checked map; ValueError naming the flag."""
    if args.default_chat_template_kwargs is None:
        return None
    kwargs = loads_json(args.default_chat_template_kwargs, "--default-chat-template-kwargs")
    return check_chat_template_kwargs(kwargs, "--default-chat-template-kwargs") or None


def tool_parser_from_args(args: argparse.Namespace) -> str | None:
    """The parser `tool_choice: "auto"` reads calls with (None: auto is refused); ValueError when
    --enable-auto-tool-choice comes without --tool-call-parser, or with `openai` but without
    --reasoning-parser gpt_oss."""
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser "
                         f"({', '.join(sorted(PARSERS))})")
    harmony_calls = args.enable_auto_tool_choice and args.tool_call_parser == "openai"
    if harmony_calls and getattr(args, "reasoning_parser", None) != "gpt_oss":  # `aqueduct batch` has none
        raise ValueError("--tool-call-parser openai requires --reasoning-parser gpt_oss (harmony's markers are "
                         "special tokens, which only gpt_oss's requests keep in the text)")
    return args.tool_call_parser if args.enable_auto_tool_choice else None


def api_key_from_args(args: argparse.Namespace) -> str | ApiKeys | None:
    """--api-key's one key or --api-keys' file (never both: which key would name the tenant?)."""
    if not getattr(args, "api_keys", None):
        return args.api_key or None
    if args.api_key:
        raise ValueError("--api-key and --api-keys do not go together (AQUEDUCT_API_KEY sets the first): "
                         "put that key in the file, with its tenant")
    return load_api_keys(args.api_keys)


def options_from_args(args: argparse.Namespace) -> GatewayOptions:
    """ValueError for flags that do not go together."""
    tool_call_parser = tool_parser_from_args(args)
    return GatewayOptions(api_key=api_key_from_args(args), max_pending=args.max_pending,
                          worker_timeout_s=args.worker_timeout, request_timeout_s=args.request_timeout,
                          max_request_bytes=args.max_request_bytes, metrics_open=args.metrics_open,
                          served_model_names=tuple(args.served_model_name or ()),
                          allowed_origins=tuple(args.allowed_origins or ()), strict_fields=args.strict_fields,
                          tool_call_parser=tool_call_parser, reasoning_parser=args.reasoning_parser,
                          default_chat_template_kwargs=template_kwargs_from_args(args),
                          runtime_lora_updating=runtime_lora_updating(args, os.environ), lora_root=args.lora_root,
                          batches=batch_options_from_args(args))
