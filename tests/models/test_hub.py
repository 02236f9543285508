"""Models by Hub id: `--model org/name` and `load_model("org/name")` download the model through
transformers into the standard Hugging Face cache (HF_HOME) the first time, saying so in one line,
and load it from the cache afterwards with no Hub at all (offline, the server gone); offline, an id
that is not cached is refused in one line, and so is an id the Hub does not have.

The Hub is `hub_server.HubServer`, a local stand-in on 127.0.0.1 answering huggingface_hub's file
API (HF_ENDPOINT points at it), serving the tiny random model saved with save_pretrained. Each
command runs in a fresh interpreter, as huggingface_hub reads HF_ENDPOINT and HF_HOME at import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hub_server import COMMIT, HubServer

ROOT = Path(__file__).resolve().parents[2]
REPO = "tsorg/tiny-llama"
PROMPT = "Use 4 5 6 10 to make 24."


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """The tiny random model and its tokenizer, saved as a Hub repo holds them."""
    from treesearch.models.load import tiny_model

    folder = tmp_path_factory.mktemp("repo")
    lm = tiny_model(seed=0)
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


def env(hf_home: Path, endpoint: str, **extra: str) -> dict:
    keep = ("HOME", "PATH", "TREESEARCH_CACHE", "XDG_CACHE_HOME")
    out = {k: v for k, v in os.environ.items() if k in keep}
    out.update(
        PYTHONPATH=str(ROOT),
        HF_HOME=str(hf_home),
        HF_ENDPOINT=endpoint,
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    out.update(extra)
    return out


def treesearch(args: list[str], environ: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "treesearch", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=environ,
        cwd=cwd,
    )


LOGITS = """
import sys, torch
from treesearch.models.load import load_model
lm = load_model(sys.argv[1])
ids = lm.tokenizer(sys.argv[2], return_tensors="pt").input_ids
with torch.no_grad():
    torch.save(lm.model(ids).logits[0, -1], sys.argv[3])
print(lm.name, lm.model.config.num_hidden_layers)
"""


def logits_of(folder_or_id: str, environ: dict, out: Path) -> torch.Tensor:
    """The next-token logits after PROMPT of `load_model(folder_or_id)`, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", LOGITS, folder_or_id, PROMPT, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [folder_or_id, "4"]
    return torch.load(out)


def test_a_hub_id_downloads_once_into_the_hf_cache_then_loads_without_the_hub(tiny_folder, tmp_path):
    hf_home = tmp_path / "hf"
    server = HubServer({REPO: tiny_folder})
    try:
        online = env(hf_home, server.url)
        solve = ["solve", "game24", "4 5 6 10", "--model", REPO, "--depth", "1", "--no-progress"]
        done = treesearch(solve + ["--json", "first.json"], online, tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        cache = hf_home / "hub"
        assert (  # one line before the download (transformers' progress bars follow)
            f"treesearch: downloading {REPO} from {server.url} into the Hugging Face cache ({cache}); once: "
            "later runs read it from there (--offline: download nothing)\n"
        ) in done.stderr
        got = {path for method, path in server.requests if method == "GET" and "/resolve/" in path}
        assert f"/{REPO}/resolve/{COMMIT}/model.safetensors" in got
        snapshot = cache / "models--tsorg--tiny-llama" / "snapshots" / COMMIT
        assert {p.name for p in snapshot.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
        first = json.loads((tmp_path / "first.json").read_text())
        # a second run: cached, so no download line; the Hub is only asked whether the files changed
        again = treesearch(solve + ["--json", "again.json"], online, tmp_path)
        assert again.returncode == 0 and "downloading" not in again.stderr
    finally:
        server.stop()
    gone = env(hf_home, server.url)  # nothing listens there any more
    offline = treesearch(solve + ["--json", "offline.json", "--offline"], gone, tmp_path)
    assert offline.returncode == 0, offline.stderr[-3000:]
    assert "downloading" not in offline.stderr
    later = json.loads((tmp_path / "offline.json").read_text())

    def thoughts(result: dict) -> list:
        return [(n["thought"], n["score"], n["status"]) for n in result["tree"]["nodes"]]

    assert later["answer"] == first["answer"] and thoughts(later) == thoughts(first)
    # the model from the cache is the model that was served: the same logits, exactly
    from_cache = logits_of(REPO, env(hf_home, server.url, HF_HUB_OFFLINE="1"), tmp_path / "a.pt")
    served = logits_of(
        str(tiny_folder), env(tmp_path / "hf2", server.url, HF_HUB_OFFLINE="1"), tmp_path / "b.pt"
    )
    assert torch.equal(from_cache, served)


def test_an_id_the_hub_lacks_or_an_uncached_id_offline_is_one_line_exit_2(tiny_folder, tmp_path):
    server = HubServer({REPO: tiny_folder})
    try:
        online = env(tmp_path / "hf", server.url)
        missing = treesearch(
            ["solve", "game24", "4 5 6 10", "--model", "nobody/no-such-model"], online, tmp_path
        )
        assert (missing.returncode, missing.stdout) == (2, "")
        assert missing.stderr == (
            f"treesearch: error: --model nobody/no-such-model: no such model on the Hugging Face Hub "
            f"({server.url}/nobody/no-such-model; a private one needs `hf auth login`); check the id, or "
            "pass a model folder\n"
        )
        offline = treesearch(["solve", "game24", "4 5 6 10", "--model", REPO, "--offline"], online, tmp_path)
        by_env = treesearch(
            ["solve", "game24", "4 5 6 10", "--model", REPO],
            env(tmp_path / "hf", server.url, HF_HUB_OFFLINE="1"),
            tmp_path,
        )
    finally:
        server.stop()
    line = (
        f"treesearch: error: --model {REPO} is not in the local Hugging Face cache and downloads are off "
        "(HF_HUB_OFFLINE=1 or --offline); run once without them to download it, or pass a model folder\n"
    )
    assert (offline.returncode, offline.stderr) == (2, line)
    assert (by_env.returncode, by_env.stderr) == (2, line)
    assert [p for m, p in server.requests if "tiny-llama" in p] == []  # offline: the Hub was never asked
