"""A test set over Ray workers (`treesearch run --workers`, `run_distributed`): the same results as
one process, nothing lost or written twice when a worker or the driver dies, one clear line when
Ray is missing or the address is wrong. One local Ray cluster (2 CPUs) serves the module; the
command-line runs join it with --ray-address, as they would join a real cluster's head."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from reliability_problems import Words
from run_rows import RUN, comparable, lines
from same_results import FirstChild, assert_same

from strategies import BFS
from treesearch import DistributedError, RKSCConfig, Searcher, run_distributed
from treesearch.runs.results_file import ResultsFile, run_inputs

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ["cats", "dogs", "birds", "fish", "cows", "owls", "bees", "ants"]
WORDS = functools.partial(Words, width=2, depth=2, max_new_tokens=4)  # a picklable problem factory


@pytest.fixture(scope="module")
def cluster() -> str:
    """One local Ray cluster of 2 CPUs for the module; its address, for the CLI runs to join."""
    ray = pytest.importorskip("ray")
    env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "TOKENIZERS_PARALLELISM": "false",
    }
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=200 * 2**20,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": env},
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(RUN + list(args), capture_output=True, text=True, timeout=timeout)


def trees(folder: Path) -> dict[str, tuple]:
    """Each tree file's nodes (id, parent, thought, state, status) and scores."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        parent = {link["target"]: link["source"] for link in data["links"]}
        nodes = [
            (n["id"], parent.get(n["id"]), n["thought"], json.dumps(n["state"]), n["status"])
            for n in data["nodes"]
        ]
        out[path.name] = (nodes, [n["score"] for n in data["nodes"]])
    return out


def assert_same_trees(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name][0] == b[name][0], name
        for x, y in zip(a[name][1], b[name][1]):
            assert (x is None and y is None) or abs(x - y) <= 1e-4


# -- the Python API ------------------------------------------------------------------------------------


def test_run_distributed_equals_solve_many_with_a_users_problem_and_strategy(cluster, tiny_lm):
    searcher = Searcher(tiny_lm, WORDS(), FirstChild(), RKSCConfig(), progress=False)
    ref = list(searcher.solve_many(INPUTS, concurrency=2))
    got = list(
        run_distributed(WORDS, INPUTS, workers=2, strategy=FirstChild(), model="tiny", concurrency=2, batch=1)
    )
    assert_same(ref, got)  # in input order, same trees, answers and own work
    assert [r.tree.meta["input"] for r in got] == INPUTS
    assert {r.worker for r in got} == {"worker-0", "worker-1"}  # both took inputs
    assert all(r.problem is not None for r in got)


def test_a_killed_worker_loses_nothing_and_no_input_is_written_twice(cluster, tiny_lm, tmp_path):
    import ray

    from treesearch import DistributedRun

    problem = Words(width=2, depth=3, max_new_tokens=5)
    searcher = Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(), progress=False)
    ref = list(searcher.solve_many(INPUTS, concurrency=2))
    killed = []

    class KillOne:
        """run_inputs' source: the run's results; after the first, one worker holding inputs is killed."""

        def __init__(self, run):
            self.run, self.problem = run, run.problem

        def solve_items(self, items):
            for row in self.run.solve_items(items):
                if not killed:
                    name, keys = max(self.run.holding().items(), key=lambda kv: len(kv[1]))
                    assert keys, "the kill must hit a worker that holds unfinished inputs"
                    killed.append((name, keys))
                    ray.kill(self.run.actors()[name])
                yield row

    with DistributedRun(
        problem, workers=2, strategy=BFS(breadth=2), model="tiny", concurrency=2, batch=1
    ) as run:
        with ResultsFile(tmp_path / "out.jsonl") as out:  # refuses an index written twice
            summary = run_inputs(KillOne(run), list(enumerate(INPUTS)), out, progress=False)
        assert run.restarts == 1  # a replacement was started
        requeued = dict(run.requeued)
    rows = lines(tmp_path / "out.jsonl")
    assert sorted(r["index"] for r in rows) == list(range(len(INPUTS)))  # every input once
    by_index = {r["index"]: r for r in rows}
    for i, r in enumerate(ref):
        assert (by_index[i]["answer"], by_index[i]["solved"], by_index[i]["status"]) == (
            r.answer,
            r.solved,
            "complete",
        )
        assert by_index[i]["stats"]["decode_tokens"] == r.stats["decode_tokens"]
    name, keys = killed[0]
    # ray.kill is asynchronous: a reply the worker sent before it died is kept (not run again), so not
    # all it held at the kill need come back; what the driver did take back from it ran elsewhere, once.
    assert requeued and set(requeued.values()) == {name}
    assert not any(by_index[k]["worker"] == name for k in requeued)
    assert summary.inputs == len(INPUTS) and sum(summary.per_worker.values()) == len(INPUTS)


class Locked(Words):
    """A problem that holds a lock: it cannot be pickled for the workers."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()


def test_a_problem_that_cannot_be_sent_is_named_before_anything_starts():
    pytest.importorskip("ray")
    with pytest.raises(
        DistributedError, match="the problem Locked cannot be sent to the Ray workers.*module level"
    ):
        run_distributed(Locked(), ["a"], workers=1, model="tiny")


def test_a_worker_that_cannot_load_its_model_is_one_line(cluster, tmp_path):
    with pytest.raises(
        DistributedError, match=r"worker-0 could not start: .*ModelNotFoundError: .*nonexistent"
    ):
        list(run_distributed(WORDS, ["a"], workers=1, model=str(tmp_path / "nonexistent")))


# -- the command line -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[list[dict], dict]:
    """The one-process run of game24 rows 900-905 (tiny model): its lines and its trees."""
    folder = tmp_path_factory.mktemp("one")
    done = cli(
        "--range",
        "900:906",
        "--concurrency",
        "2",
        "--out",
        str(folder / "one.jsonl"),
        "--trees",
        str(folder / "trees"),
    )
    assert done.returncode == 0, done.stderr
    return lines(folder / "one.jsonl"), trees(folder / "trees")


def test_workers_2_write_the_one_process_file(cluster, one_process, tmp_path):
    rows, tree_files = one_process
    done = cli(
        "--range",
        "900:906",
        "--concurrency",
        "2",
        "--workers",
        "2",
        "--ray-address",
        cluster,
        "--out",
        str(tmp_path / "ray.jsonl"),
        "--trees",
        str(tmp_path / "trees"),
    )
    assert done.returncode == 0, done.stderr
    got = lines(tmp_path / "ray.jsonl")
    assert comparable(sorted(got, key=lambda r: r["index"])) == comparable(rows)
    assert_same_trees(trees(tmp_path / "trees"), tree_files)
    assert "2 workers ready" in done.stderr and "per worker: worker-0: " in done.stdout
    assert "accuracy" in done.stdout and "inputs/h" in done.stdout


def _wait_lines(path: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_text().count("\n") >= n:  # whole lines only
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} did not reach {n} lines (exit {proc.poll()})")


def test_a_killed_then_interrupted_driver_resumes_without_duplicates(cluster, one_process, tmp_path):
    rows, _ = one_process
    # 100 inputs: the tiny model's searches take milliseconds, and 30 could all finish between
    # the line the test waits for and the Ctrl-C it then sends (seen on a quiet machine)
    out = tmp_path / "out.jsonl"
    argv = RUN + [
        "--range",
        "900:1000",
        "--concurrency",
        "1",
        "--workers",
        "2",
        "--ray-address",
        cluster,
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_lines(out, 2, proc)
    proc.send_signal(signal.SIGKILL)  # the driver dies; its workers go with its job
    proc.wait()
    first = len(out.read_text().splitlines())
    assert 2 <= first < 100
    with open(out, "a") as f:
        f.write('{"index": 9')  # a half-written line, as a kill during a write would leave
    proc = subprocess.Popen(argv + ["--resume"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_lines(out, first + 1, proc)
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert f"{first} already in" in err and "--resume" in err and "Traceback" not in err
    second = len(lines(out))  # every line whole
    assert first < second < 100
    done = subprocess.run(argv + ["--resume"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{second} already in" in done.stderr
    got = sorted(lines(out), key=lambda r: r["index"])
    assert [r["index"] for r in got] == list(range(900, 1000))  # none missing, none twice
    assert comparable(got[:6]) == comparable(rows)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_where_nothing_answers_fails_at_once_in_one_line(tmp_path):
    pytest.importorskip("ray")
    port = _free_port()
    t0 = time.monotonic()
    done = cli(
        "--range",
        "900:901",
        "--workers",
        "2",
        "--ray-address",
        f"127.0.0.1:{port}",
        "--out",
        str(tmp_path / "x.jsonl"),
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(
        f"treesearch: error: --ray-address 127.0.0.1:{port}: nothing answers there"
    )
    assert "ray start --head" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - t0 < 60
    done = cli(
        "--range",
        "900:901",
        "--workers",
        "2",
        "--ray-address",
        "nowhere",
        "--out",
        str(tmp_path / "y.jsonl"),
        timeout=120,
    )
    assert done.returncode == 2 and "--ray-address nowhere: write HOST:PORT" in done.stderr


BLOCK_RAY = "import sys; sys.modules['ray'] = None  # as if Ray were not installed\n"


def test_without_ray_workers_name_the_install_command_and_the_rest_works(tmp_path):
    code = BLOCK_RAY + (
        "import treesearch\n"
        "from treesearch import DistributedError, run_distributed\n"
        "from treesearch.tasks.game24 import Game24\n"
        "try:\n"
        "    run_distributed(Game24, ['4 5 6 10'], workers=1)\n"
        "except DistributedError as exc:\n"
        "    print('api:', exc)\n"
        "from treesearch.cli.main import main\n"
        f"sys.exit(main(['run', 'game24', '--workers', '2', '--out', {str(tmp_path / 'x.jsonl')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "api: Ray is not installed" in done.stdout and "pip install -e '.[ray]'" in done.stdout
    assert done.stderr == (
        "treesearch: error: --workers needs Ray, which is not installed; install it with: "
        "pip install -e '.[ray]' (in a checkout of treesearch; elsewhere: pip install "
        "'ray>=2.40,<3')\n"
    )
    assert not (tmp_path / "x.jsonl").exists()
    # and a run without --workers does not touch Ray
    code = BLOCK_RAY + (
        "from treesearch.cli.main import main\n"
        f"sys.exit(main(['run', 'game24', '--range', '900:901', '--model', 'tiny', '--no-progress', "
        f"'--threads', '1', '--out', {str(tmp_path / 'one.jsonl')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert len(lines(tmp_path / "one.jsonl")) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ray-address", "auto"], "--ray-address needs --workers N"),
        (["--gpus-per-worker", "1"], "--gpus-per-worker needs --workers N"),
        (["--workers", "0"], "--workers 0: use at least 1 Ray worker"),
        (["--workers", "2", "--device", "cuda"], "--device cuda with --workers: add --gpus-per-worker 1"),
    ],
)
def test_worker_flag_errors_are_one_line(argv, message, tmp_path, capsys):
    from treesearch.cli import main as cli_module

    assert cli_module.main(["run", "game24", "--out", str(tmp_path / "x.jsonl"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"treesearch: error: {message}") and err.count("\n") == 1
    assert not (tmp_path / "x.jsonl").exists()


# -- the default model -------------------------------------------------------------------------------------


@pytest.mark.real_model
@pytest.mark.slow
def test_two_workers_with_the_default_model_equal_one_process(cluster, real_lm):
    from treesearch.tasks.game24 import Game24, load_puzzles

    puzzles = load_puzzles(900, 902)
    bfs = BFS(breadth=1, max_depth=1)  # one move deep: short, and still real generations and scores
    ref = list(
        Searcher(real_lm, Game24(), bfs, RKSCConfig(), progress=False).solve_many(puzzles, concurrency=2)
    )
    got = list(run_distributed(Game24, puzzles, workers=2, strategy=bfs, concurrency=1, batch=1))
    assert_same(ref, got)
    assert {r.worker for r in got} == {"worker-0", "worker-1"}
    assert sum(len(r.tree) for r in got) > len(got)  # the model proposed moves (the default model often one)
