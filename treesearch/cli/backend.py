"""Command-line options that choose the engine: the local one or an OpenAI-compatible server.

    treesearch solve game24 "4 5 6 10" --backend server --base-url http://127.0.0.1:8000/v1 --server-model NAME

`add_backend_args(parser)` adds the group, `backend_from_args(args)` builds the ServerEngine (None
for the local engine: the command loads its model as before). `treesearch bench` reuses the
server options alone (`add_server_args`), its `server` mode being the backend. The API key is read
from the environment (TREESEARCH_API_KEY, else OPENAI_API_KEY), never from a flag, so it stays out
of shell history and process lists.
"""  # noqa: E501  (command lines, kept whole to copy)

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from treesearch.common.errors import UsageError

API_KEY_VARS = ("TREESEARCH_API_KEY", "OPENAI_API_KEY")


def add_server_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """--base-url, --server-model and the server's connection settings."""
    g = parser.add_argument_group(
        "server",
        "an OpenAI-compatible server (vLLM, SGLang, llama.cpp); the API key "
        "is read from " + " or ".join(API_KEY_VARS),
    )
    g.add_argument(
        "--base-url",
        default=None,
        metavar="URL",
        help="the server's URL, e.g. http://127.0.0.1:8000/v1 (default: none; the server backend needs it)",
    )
    g.add_argument(
        "--server-model",
        default=None,
        metavar="NAME",
        help="the served model's name (default: the first model the server lists)",
    )
    g.add_argument(
        "--server-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="seconds to wait for a connection or an answer (default 300)",
    )
    g.add_argument(
        "--server-retries",
        type=int,
        default=3,
        metavar="N",
        help="retries on connection errors, HTTP 429 and 5xx, with exponential backoff (default 3)",
    )
    g.add_argument(
        "--server-concurrency",
        type=int,
        default=8,
        metavar="N",
        help="requests in flight at once (default 8)",
    )
    g.add_argument(
        "--server-max-context",
        type=int,
        default=None,
        metavar="TOKENS",
        help="the model's context window: branches that do not fit are pruned (default: the server checks)",
    )
    g.add_argument(
        "--server-logprobs",
        default="on",
        choices=["on", "off"],
        help="ask for generated tokens' log-probabilities (confidences, CGEE Level 1; default on; off is "
        "faster on llama-cpp-python)",
    )
    g.add_argument(
        "--server-extra",
        default=None,
        metavar="JSON",
        help="fields added to every completion request, e.g. '{\"top_k\": 0}' (default: none)",
    )
    return g


def add_backend_args(parser: argparse.ArgumentParser) -> None:
    """--backend local|server plus the server options."""
    parser.add_argument(
        "--backend",
        default="local",
        choices=["local", "server"],
        help="local: our engine (default); server: an OpenAI-compatible server (needs --base-url)",
    )
    add_server_args(parser)


def api_key_from_env() -> str | None:
    """The API key from the first of TREESEARCH_API_KEY, OPENAI_API_KEY that is set."""
    return next((os.environ[v] for v in API_KEY_VARS if os.environ.get(v)), None)


def server_extra(args: argparse.Namespace) -> dict | None:
    """The server options checked without contacting the server: --base-url is given and --server-extra,
    if given, is a JSON object (returned); a UsageError with the fix otherwise."""
    if not args.base_url:
        raise UsageError("the server backend needs --base-url, e.g. --base-url http://127.0.0.1:8000/v1")
    if not args.server_extra:
        return None
    try:
        extra = json.loads(args.server_extra)
    except ValueError as err:
        raise UsageError(f"--server-extra is not JSON ({err}); write e.g. '{{\"top_k\": 0}}'") from None
    if not isinstance(extra, dict):
        raise UsageError("--server-extra must be a JSON object, e.g. '{\"top_k\": 0}'")
    return extra


def check_backend_flags(args: argparse.Namespace) -> None:
    """With --backend server, the server options (see `server_extra`), before anything is written."""
    if getattr(args, "backend", "local") == "server":
        server_extra(args)


def server_from_args(args: argparse.Namespace) -> Any:
    """The ServerEngine the server options describe (a UsageError with the fix when one is missing)."""
    extra = server_extra(args)
    from treesearch.backends.server import ServerEngine

    try:
        return ServerEngine(
            args.base_url,
            args.server_model,
            api_key_from_env(),
            timeout=args.server_timeout,
            retries=args.server_retries,
            max_concurrency=args.server_concurrency,
            max_context=args.server_max_context,
            extra_body=extra,
            logprobs=args.server_logprobs == "on",
        )
    except ImportError as err:
        raise UsageError(str(err)) from None


def backend_from_args(args: argparse.Namespace) -> Any:
    """The engine `--backend` names: a ServerEngine, or None for the local engine (the caller
    loads its model as usual)."""
    if getattr(args, "backend", "local") != "server":
        return None
    return server_from_args(args)
