"""`ServerEngine` against llama.cpp's own C++ server, `llama-server` (built from source by
`make llama-server`), serving the default GGUF model on 127.0.0.1: a Game of 24 search through it,
label probabilities read from its top-n next-token log-probabilities (checked against its native
/completion endpoint), per-row seeds, the cached-token counts it reports, a server killed mid-search
and a slot limit below the concurrency. Each server is started by the test (on a free port, ready
within START_S seconds) and killed after it. Without the binary every test here skips, naming
`make llama-server`."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

httpx = pytest.importorskip(
    "httpx", reason="the server backend needs httpx: pip install 'treesearch[server]'"
)

from fake_servers import default_gguf_or_skip, free_port  # noqa: E402

from treesearch import Sampling, Searcher, ServerEngine  # noqa: E402
from treesearch.backends.http import root_url  # noqa: E402
from treesearch.common.errors import ServerError  # noqa: E402

pytestmark = pytest.mark.llama_server

ALIAS = "smollm2-135m-instruct-q4_1"  # the name the server gives the model (no CGEE calibration)
START_S = 180  # seconds a server has to load the model and answer /v1/models
ENV = "TREESEARCH_LLAMA_SERVER"  # path of a llama-server binary, instead of the one `make llama-server` links


def llama_server_binary() -> Path | None:
    """$TREESEARCH_LLAMA_SERVER, else the `llama-server` beside this Python (`make llama-server` links
    it into .venv/bin), else one on PATH."""
    for candidate in (
        os.environ.get(ENV),
        Path(sys.executable).parent / "llama-server",
        shutil.which("llama-server"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


@dataclass
class LlamaServer:
    proc: subprocess.Popen
    url: str  # the /v1 URL
    log: Path

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@contextmanager
def running_llama_server(
    log: Path, *, parallel: int, gguf: Path | None = None, alias: str = ALIAS
) -> Iterator[LlamaServer]:
    """llama-server with the default GGUF (or `gguf`) on a free 127.0.0.1 port, `parallel` slots sharing
    one 4096-token KV cache, one thread (llama.cpp's OpenMP barriers spin: more threads than free cores
    slow it down badly on a busy machine); killed on exit."""
    binary = llama_server_binary()
    if binary is None:
        pytest.skip(
            f"llama-server is not built: run `make llama-server` (or set {ENV}=/path/to/llama-server)"
        )
    gguf = gguf or default_gguf_or_skip()
    port = free_port()
    cmd = [str(binary), "-m", str(gguf), "-a", alias, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-c", "4096", "-np", str(parallel), "-kvu", "-t", "1", "-tb", "1", "--no-webui"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    server = LlamaServer(proc, f"http://127.0.0.1:{port}/v1", log)
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(server.url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama-server was not ready within {START_S} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[LlamaServer]:
    with running_llama_server(tmp_path_factory.mktemp("llama_server") / "server.log", parallel=4) as srv:
        yield srv


@pytest.fixture
def engine(server) -> Iterator[ServerEngine]:
    eng = ServerEngine(server.url, ALIAS, timeout=120, max_concurrency=4)
    yield eng
    eng.close()


def value_prompts(n: int) -> list[str]:
    """Game of 24 value prompts of the puzzles 900.. (initial states only: distinct numbers)."""
    from treesearch.tasks.game24 import Game24, load_puzzles

    game = Game24()
    return [game.value_prompt(game.initial_state(p)) for p in load_puzzles(900, 900 + n)]


def test_game24_bfs_solves_through_llama_server(engine):
    from strategies import BFS
    from treesearch.tasks.game24 import LABELS, Game24

    result = Searcher(engine, Game24(), BFS(breadth=2, max_depth=2), progress=False).solve("4 5 6 10")
    tree, stats = result.tree, result.stats
    assert result.status == "complete" and len(tree) > 1
    assert stats["generate_calls"] >= 1 and stats["score_calls"] >= 1
    valued = [tree.node(n) for n in tree.graph if "label_probs" in tree.node(n)]
    assert valued and all(sum(d["label_probs"].values()) == pytest.approx(1.0, abs=1e-9) for d in valued)
    # the labels come from the server's top-n (not the floor every label gets when none is read)
    assert stats["label_floor_hits"] < len(valued) * len(LABELS)
    assert stats["reused_tokens"] > 0  # llama-server reports the prompt tokens it took from its cache
    assert all(0 < tree.node(n)["confidence"] <= 1 for n in tree.graph if n != tree.root)


# llama.cpp's numbers for one prompt depend on the batch it is decoded in and on what its slots have
# cached (measured on value prompts 900-905: P(" sure") moved by up to 15% in a batch of four, by up
# to 16% on a second pass with the prompt cache). One request at a time without the prompt cache,
# its answers are the same every time: the tests that compare two answers for equality ask that way.
ALONE = {"cache_prompt": False}


@pytest.fixture
def alone(server) -> Iterator[ServerEngine]:
    eng = ServerEngine(server.url, ALIAS, timeout=120, max_concurrency=1, extra_body=ALONE)
    yield eng
    eng.close()


def test_value_labels_get_the_probabilities_llama_server_gives_their_first_tokens(alone, server):
    """Each label's raw probability is exp(logprob) of its first token in the server's own top-20
    (its native /completion with n_probs)."""
    from treesearch.tasks.game24 import LABELS

    prompts = value_prompts(3)
    scores = alone.score(prompts, list(LABELS))
    assert alone.stats.score_calls == 1 and alone.stats.model_calls == 3
    for prompt, s in zip(prompts, scores):
        native = httpx.post(
            root_url(server.url) + "/completion",
            json={"prompt": prompt, "n_predict": 1, "n_probs": 20, "temperature": 0, **ALONE},
            timeout=120,
        ).json()
        top = {e["token"]: e["logprob"] for e in native["completion_probabilities"][0]["top_logprobs"]}
        listed = [lab for lab in LABELS if alone.label_key(lab) in top]
        assert listed, (top, LABELS)  # at least one label is among the top 20
        for lab in listed:
            assert s.raw[lab] == pytest.approx(math.exp(top[alone.label_key(lab)]), rel=1e-5)
        assert sum(s.probs.values()) == pytest.approx(1.0, abs=1e-9)


def test_sampled_rows_keep_their_own_seeds(alone):
    prompt = "Write one short sentence about the sea.\n"
    sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=20)
    gens = alone.generate([prompt] * 4, sampling, seeds=[5, 5, 6, 7])
    texts = [g.text for g in gens]
    assert texts[0] == texts[1]  # same seed, same text
    assert len({texts[0], texts[2], texts[3]}) == 3  # other seeds, other texts
    assert alone.generate([prompt], sampling, seeds=[6])[0].text == texts[2]  # in a later call too
    for g in gens:  # each token's id, log-probability and character range, covering the text
        assert g.token_ids and len(g.logprobs) == len(g.token_ids) == len(g.offsets)
        assert "".join(g.text[a:b] for a, b in g.offsets) == g.text


def test_cached_token_counts_are_read_where_llama_server_reports_them(server):
    """One request at a time: each value prompt after the first finds the few-shot template in a
    slot's cache, and the answer's usage.prompt_tokens_details.cached_tokens says so."""
    from treesearch.tasks.game24 import LABELS, VALUE_PROMPT

    eng = ServerEngine(server.url, ALIAS, timeout=120, max_concurrency=1)
    template = len(eng.tokenize(VALUE_PROMPT.split("{numbers}")[0]))
    prompts = value_prompts(4)
    scores = eng.score(prompts, list(LABELS))
    total = sum(len(eng.tokenize(p)) for p in prompts)
    eng.close()
    assert all(s.reused_tokens >= template - 1 for s in scores[1:]), (
        [s.reused_tokens for s in scores],
        template,
    )
    assert eng.stats.reused_tokens == sum(s.reused_tokens for s in scores)
    assert eng.stats.prefill_tokens + eng.stats.reused_tokens == total


def test_llama_servers_own_timings_are_collected_and_match_its_token_counts(server):
    """Each /v1/completions answer of llama-server carries `timings`: the client sums them, one per
    request, with the prompt tokens it evaluated (its cache left out) and the tokens it generated
    equal to what `usage` counts; the round trips are timed, each of them."""
    from treesearch.tasks.game24 import LABELS, Game24

    eng = ServerEngine(server.url, ALIAS, timeout=120, max_concurrency=4)
    before = eng.times()
    game = Game24()
    state = game.initial_state("4 5 6 10")
    eng.generate([game.expand_prompt(state)], Sampling(temperature=0.0, max_new_tokens=16))
    eng.score(value_prompts(3), list(LABELS))
    t = eng.times().since(before)
    eng.close()
    assert t.timed == eng.stats.model_calls == 4
    assert t.predicted_n == eng.stats.generated_tokens
    assert t.prompt_n == eng.stats.prefill_tokens  # usage's prompt tokens less the cached ones
    assert t.prompt_ms > 0 and t.predicted_ms > 0
    assert t.requests >= 4 and 0 < t.busy_s <= t.request_s


@pytest.mark.real_model
def test_the_float32_gguf_serves_in_llama_server_with_our_engines_greedy_text(tmp_path, real_lm):
    """`make gguf-f32`'s file loads in llama-server as all-F32 weights, and a greedy continuation
    from it is token for token the one our float32 engine decodes from the same weights."""
    from treesearch.engine.local import Engine
    from treesearch.models.load import default_f32_gguf_path

    path = default_f32_gguf_path()
    if not path.exists():
        pytest.skip(f"{path} is absent: run `make gguf-f32`")
    prompt = "The capital of France is"
    greedy = Sampling(temperature=0.0, max_new_tokens=8)
    ours = Engine(real_lm).generate([prompt], greedy)[0]
    with running_llama_server(tmp_path / "server.log", parallel=1, gguf=path, alias="f32") as srv:
        meta = httpx.get(srv.url + "/models", timeout=10).json()["data"][0]["meta"]
        eng = ServerEngine(srv.url, "f32", timeout=120, max_concurrency=1)
        theirs = eng.generate([prompt], greedy)[0]
        eng.close()
    assert meta["ftype"] == "all F32"
    assert theirs.token_ids == list(ours.token_ids) and theirs.text == ours.text


def test_llama_server_tokenizes_like_the_models_tokenizer(engine, tiny_lm):
    text = "Numbers: 4 5 6 10\nJudgement: sure"
    assert engine.tokenize(text) == tiny_lm.tokenizer.encode(text, add_special_tokens=False)


def test_the_server_killed_mid_search_fails_clearly_and_keeps_the_partial_tree(tmp_path):
    from strategies import BFS
    from treesearch.tasks.game24 import Game24

    with running_llama_server(tmp_path / "server.log", parallel=2) as srv:
        eng = ServerEngine(srv.url, ALIAS, timeout=120, retries=1, backoff=0.01, max_concurrency=2)
        searcher = Searcher(eng, Game24(), BFS(breadth=2, max_depth=3), progress=False)

        def kill_after_two_answers():
            deadline = time.monotonic() + 300
            while eng.stats.model_calls < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            srv.kill()

        killer = threading.Thread(target=kill_after_two_answers)
        killer.start()
        with pytest.raises(ServerError) as err:
            searcher.solve("4 5 6 10")
        killer.join()
        eng.close()
    msg = str(err.value)
    assert "failed after 2 attempts" in msg and f"is a server running at {root_url(srv.url)}?" in msg
    part = err.value.partial_result
    assert part.status == "interrupted" and "ServerError" in part.error
    assert len(part.tree) > 1 and part.stats["model_calls"] >= 2  # the root's expansion, and more


def test_a_slot_limit_below_the_concurrency_queues_requests_and_loses_none(tmp_path):
    """Two slots, eight requests at once: the server queues six, and every row gets its own answer
    (as many answers as requests, each counting its own prompt's tokens)."""
    from treesearch.tasks.game24 import LABELS, Game24, load_puzzles

    game = Game24()
    states = [game.initial_state(p) for p in load_puzzles(900, 908)]
    expand = [game.expand_prompt(s) for s in states]
    values = [game.value_prompt(s) for s in states]
    greedy = Sampling(temperature=0.0, max_new_tokens=24)
    with running_llama_server(tmp_path / "server.log", parallel=2) as srv:
        wide = ServerEngine(srv.url, ALIAS, timeout=300, max_concurrency=8)
        gens, scores = wide.generate(expand, greedy), wide.score(values, list(LABELS))
        lengths = [len(wide.tokenize(p)) for p in expand]
        wide.close()
        slots = set(re.findall(r"slot\s+\w+: id\s+(\d+)", srv.log.read_text()))
    assert slots == {"0", "1"}  # two slots served the eight requests
    assert wide.stats.model_calls == 16 and wide.stats.generate_calls == wide.stats.score_calls == 1
    assert [g.prompt_tokens for g in gens] == lengths and all(g.text and g.token_ids for g in gens)
    assert len(scores) == 8 and all(sum(s.probs.values()) == pytest.approx(1.0, abs=1e-9) for s in scores)
    assert wide.stats.label_floor_hits < 8 * len(LABELS)
