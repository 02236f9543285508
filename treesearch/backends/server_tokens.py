"""Token ids through a server's tokenize endpoint, and the text by which the server names a label's
first token in its top-k log-probabilities (`ServerTokenizer`, used by `ServerEngine`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from treesearch.backends.http import ServerClient
from treesearch.common.errors import ProblemDefinitionError, ServerError

log = logging.getLogger(__name__)

# Tokenize endpoints tried in order: vLLM and llama.cpp's server share /tokenize (vLLM reads
# "prompt", llama.cpp "content"), SGLang has /v1/tokenize, llama-cpp-python /extras/tokenize.
TOKENIZE_ENDPOINTS: tuple[tuple[str, Callable[[str, str], dict]], ...] = (
    (
        "/tokenize",
        lambda model, text: {
            "model": model,
            "prompt": text,
            "content": text,
            "add_special_tokens": False,
            "add_special": False,
        },
    ),
    ("/v1/tokenize", lambda model, text: {"model": model, "prompt": text, "add_special_tokens": False}),
    ("/extras/tokenize", lambda model, text: {"model": model, "input": text}),
)
CACHE_LIMIT = 100_000  # texts whose ids are kept


class NoTokenizeEndpoint(ServerError):
    """The server offers none of the tokenize endpoints in TOKENIZE_ENDPOINTS."""


class ServerTokenizer:
    """Token ids of texts as the served model reads them, asked of the server once per text: the
    first endpoint of TOKENIZE_ENDPOINTS that answers is kept, a special prefix the endpoint always
    adds (a BOS) is cut off, and each label's key (its first token's text) is remembered."""

    def __init__(self, client: ServerClient, model: str) -> None:
        self.client = client
        self.model = model
        self._path: str | None = None
        self._special_prefix: list[int] | None = None
        self._cache: dict[str, list[int]] = {}
        self._label_keys: dict[str, str] = {}

    def tokenize(self, text: str) -> list[int]:
        """Token ids of text (no BOS); NoTokenizeEndpoint where the server has no tokenize endpoint."""
        if not isinstance(text, str):
            raise ProblemDefinitionError(f"a prompt must be a str, got {type(text).__name__}: {text!r:.80}")
        hit = self._cache.get(text)
        if hit is not None:
            return list(hit)
        if self._special_prefix is None:
            self._special_prefix = self._tokenize_raw("")  # e.g. [BOS] where the endpoint always adds it
        ids = self._tokenize_raw(text)
        k = len(self._special_prefix)
        if k and ids[:k] == self._special_prefix:
            ids = ids[k:]
        if len(self._cache) < CACHE_LIMIT:
            self._cache[text] = list(ids)
        return ids

    def _tokenize_raw(self, text: str) -> list[int]:
        paths = [e for e in TOKENIZE_ENDPOINTS if self._path in (None, e[0])]
        for path, make_body in paths:
            status, data = self.client.post(path, make_body(self.model, text), allow=(404, 405))
            if status < 400 and isinstance(data, dict) and isinstance(data.get("tokens"), list):
                self._path = path
                return [int(t if not isinstance(t, dict) else t["id"]) for t in data["tokens"]]
        raise NoTokenizeEndpoint(
            f"{self.client.root} has no tokenize endpoint (tried "
            f"{', '.join(p for p, _ in TOKENIZE_ENDPOINTS)}); tokenize is needed for max_context "
            "checks and multi-token labels: use a server that has one (vLLM, llama.cpp) or leave "
            "max_context unset",
            url=self.client.root,
        )

    def label_key(self, label: str) -> str:
        """The text of the label's first token, as the server names tokens in top_logprobs: the label
        itself when it is one token (or the server cannot tokenize), else the longest prefix of the
        label that tokenizes to the label's first token alone."""
        if label in self._label_keys:
            return self._label_keys[label]
        if not isinstance(label, str) or not label:
            raise ProblemDefinitionError(f"label {label!r} is empty; use a non-empty word such as ' yes'")
        key = label
        try:
            ids = self.tokenize(label)
        except NoTokenizeEndpoint as err:
            log.warning("%s; label %r is taken to be one token", err, label)
            ids = []
        if len(ids) > 1:
            key = next(
                (label[:i] for i in range(len(label) - 1, 0, -1) if self.tokenize(label[:i]) == ids[:1]),
                label,
            )
        self._label_keys[label] = key
        return key
