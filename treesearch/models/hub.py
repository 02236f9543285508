"""Models by Hugging Face Hub id (`--model Qwen/Qwen2.5-1.5B-Instruct`, `load_model("org/name")`).

An id whose files are not in the standard Hugging Face cache ($HF_HOME/hub, by default
~/.cache/huggingface/hub) is downloaded there through transformers, with its progress bars, the
first time it loads; later loads read the cache. Before that, `check_hub_id` fetches only the
model's config.json (small), so a mistyped id, a gated model or an unreachable Hub is one line
before torch is imported. Offline (HF_HUB_OFFLINE=1, or TRANSFORMERS_OFFLINE=1; the CLI's
`--offline` sets it) nothing is fetched: an id must already be in the cache.
"""

from __future__ import annotations

import os
import re

from treesearch.common.errors import ModelNotFoundError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def is_hub_id(name: str) -> bool:
    """True for a name shaped like a Hub id (`name` or `org/name`)."""
    return bool(HUB_ID.match(name))


def offline() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set to a true value (read now, not at
    import, so that `--offline` takes effect even after huggingface_hub was imported)."""
    return any(os.environ.get(v, "").strip().upper() in ("1", "ON", "YES", "TRUE") for v in OFFLINE_VARS)


def set_offline() -> None:
    """Turn offline mode on for this process (the CLI's --offline), before huggingface_hub reads it."""
    os.environ["HF_HUB_OFFLINE"] = "1"


def in_cache(repo_id: str) -> bool:
    """True when the local Hugging Face cache holds the model's config.json (no network access)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def endpoint() -> str:
    """The Hub that ids are fetched from: $HF_ENDPOINT, else https://huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def check_hub_id(repo_id: str) -> bool:
    """Raise ModelNotFoundError in one line when `repo_id` cannot load: offline and not cached; or
    online and its config.json cannot be fetched (no such model, a gated one, the Hub unreachable).
    Returns True when the model's weights are not cached yet (the load will download them)."""
    if in_cache(repo_id):
        return not _weights_cached(repo_id)
    if offline():
        raise ModelNotFoundError(
            f"{repo_id} is not in the local Hugging Face cache and downloads are off (HF_HUB_OFFLINE=1 or "
            "--offline); run once without them to download it, or pass a model folder"
        )
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    page = f"{endpoint()}/{repo_id}"
    try:
        hf_hub_download(repo_id, "config.json")
    except LocalEntryNotFoundError as exc:  # before EntryNotFoundError, its base: the Hub was not reached
        raise ModelNotFoundError(_unreachable(repo_id, exc)) from None
    except GatedRepoError:
        raise ModelNotFoundError(
            f"{repo_id} is gated on the Hugging Face Hub: accept its terms at {page} and log in with "
            "`hf auth login`"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"{repo_id}: no such model on the Hugging Face Hub ({page}; a private one needs "
            "`hf auth login`); check the id, or pass a model folder"
        ) from None
    except (EntryNotFoundError, RevisionNotFoundError):
        raise ModelNotFoundError(
            f"{repo_id} has no config.json on the Hugging Face Hub ({page}): it is not a transformers model"
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        raise ModelNotFoundError(_unreachable(repo_id, exc)) from None
    return True


def _unreachable(repo_id: str, exc: BaseException) -> str:
    why = " ".join(str(exc).split())[:160]
    return (
        f"{repo_id} is not in the local Hugging Face cache and the Hub ({endpoint()}) could not be reached "
        f"to download it ({type(exc).__name__}: {why}); check the network, or pass a model folder"
    )


def download_line(repo_id: str) -> str:
    """The line said before a model's weights download: from where, to where, and that it is once."""
    from huggingface_hub import constants

    return (
        f"downloading {repo_id} from {endpoint()} into the Hugging Face cache ({constants.HF_HUB_CACHE}); "
        "once: later runs read it from there (--offline: download nothing)"
    )


def _weights_cached(repo_id: str) -> bool:
    """True when the cache holds the model's weights (one safetensors file or its index)."""
    from huggingface_hub import try_to_load_from_cache

    return any(
        isinstance(try_to_load_from_cache(repo_id, f), str)
        for f in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    )
