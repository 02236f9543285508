"""Typed exceptions for caller mistakes; each message names the fix."""

from __future__ import annotations


class TreeSearchError(Exception):
    """Base class of every error treesearch raises on purpose."""


class ModelNotInstalledError(TreeSearchError):
    """The default model package is missing; the message prints the install command."""


class ModelInstallError(TreeSearchError):
    """A known model could not be installed (`treesearch models install`): a part that cannot be
    downloaded or is not the pinned file; the message names the part."""


class ModelNotFoundError(TreeSearchError, ValueError):
    """A model name is neither the default, 'tiny', a model folder nor a model in the local Hugging Face
    cache; raised before anything loads, so a typo costs no start-up time."""


class ProblemDefinitionError(TreeSearchError):
    """A user's Problem subclass broke its contract (missing method, wrong return type, bad value)."""


class ContextTooLongError(TreeSearchError):
    """A prompt plus its generation would not fit in the model's context window."""


class CacheBudgetError(TreeSearchError):
    """The KV cache budget is too small for the work asked of it."""


class ParseError(TreeSearchError, ValueError):
    """Model output could not be parsed; the text is data and was never executed."""


class ConfigError(TreeSearchError, ValueError):
    """An invalid configuration value."""


class SaveFileError(TreeSearchError):
    """A saved search or tree file is truncated, corrupted or of another format; nothing was loaded."""


class ResumeError(TreeSearchError):
    """A saved search cannot be continued by this Searcher: another input, task, model, or a setting
    that changes what the search finds (seed, strategy and its settings, sampling, KV sharing mode,
    CGEE); the message names the setting and both values."""


class UsageError(TreeSearchError):
    """A command-line argument is invalid. The CLI prints it as one line, `treesearch: error: ...`,
    and exits with status 2, before any model loads."""


class ServerError(TreeSearchError):
    """An OpenAI-compatible server could not be reached or refused a request (after retries where
    retrying can help); the message names the URL, what failed and what to check."""

    def __init__(self, message: str, *, url: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.url = url  # the request's URL
        self.status = status  # the HTTP status the server answered with (None: no answer)


class ServerContextError(ServerError, ContextTooLongError):
    """The server refused a prompt that does not fit in its model's context window."""


class DistributedError(TreeSearchError):
    """A run over Ray workers could not start or go on: Ray is not installed, the cluster cannot be
    reached, a worker cannot start, a Problem cannot be sent, or every worker died; the message
    names the fix."""


class SearchCancelled(TreeSearchError):
    """The run that this search belonged to stopped (Ctrl-C, or its caller stopped reading results)."""


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (multi-line messages are joined with spaces)."""
    return " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
