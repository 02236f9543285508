"""What a server's `/v1/models` says: the models it serves, the name of the first, and which server
it is, for the fields added to every completion request (llama.cpp servers get neutral sampling)."""

from __future__ import annotations

from treesearch.backends.http import ServerClient
from treesearch.common.errors import ServerError

LLAMA_CPP_NEUTRAL = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}  # plain temperature / top-p sampling
LLAMA_CPP_OWNERS = ("llamacpp", "me")  # /v1/models owned_by of llama.cpp's server and llama-cpp-python's
LLAMA_SERVER_FIELDS = {"cache_prompt": True}  # llama-server ("llamacpp"): reuse a slot's cached prefix


def list_models(client: ServerClient) -> list[dict]:
    """The entries of /v1/models; [] where the server has no usable /v1/models (any HTTP answer is
    accepted: such a server may still complete)."""
    status, data = client.get("/v1/models", allow=tuple(range(400, 600)))
    models = data.get("data") if status < 400 and isinstance(data, dict) else None
    return [m for m in models or [] if isinstance(m, dict)]


def first_model(client: ServerClient, models: list[dict]) -> str:
    """The id of the first model listed, or ServerError saying how to name the model."""
    if not models or not models[0].get("id"):
        raise ServerError(
            f"{client.root}/v1/models lists no model; name the model "
            "(ServerEngine(base_url, model), --server-model)",
            url=client.root,
        )
    return str(models[0]["id"])


def request_defaults(models: list[dict], extra_body: dict) -> dict:
    """Fields added to every completion request: neutral sampling where a model is owned by llama.cpp
    (its servers default to top-k 40, min-p 0.05, a repeat penalty), `cache_prompt` for llama.cpp's
    own server, then extra_body over them."""
    owners = {str(m.get("owned_by", "")) for m in models}
    neutral = LLAMA_CPP_NEUTRAL if owners & set(LLAMA_CPP_OWNERS) else {}
    native = LLAMA_SERVER_FIELDS if "llamacpp" in owners else {}
    return {**neutral, **native, **extra_body}
