"""`SearchWorker`: what one Ray actor of a distributed run holds and does.

An actor loads the model once (`load_model` of a name, on its device, with its torch threads),
builds one `Searcher` from the run's problem and strategy, and runs `solve_stream` over the
inputs the driver hands it: up to `concurrency` searches at once over its one engine and KV
store, their model calls merged. The driver calls three methods (the actor runs them in threads
of their own, beside the search loop):

    ready()           -> the worker's description (name, host, pid, device, threads, load seconds)
    submit(items)     -> queue (index, input) pairs; the search loop takes them as room frees up
    take(wait_s)      -> the (index, SearchResult) pairs finished since the last take (waits up to
                         wait_s for the first), trees without KV handles, `worker` set

This module imports neither ray nor torch at import time: the driver wraps the class with
`ray.remote` (`treesearch.runs.distributed`), and Ray imports it by name on the workers, so only the
problem and strategy travel pickled (see `WorkerSpec`).
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.core.problem import Problem


@dataclass
class WorkerSpec:
    """Everything a worker needs to build its Searcher. `problem` is a Problem instance or a
    zero-argument callable returning one (a Problem class, a functools.partial); it and the
    strategy are pickled by Ray (cloudpickle), so their classes must be importable on the workers."""

    problem: Any
    strategy: Any
    config: RKSCConfig = field(default_factory=RKSCConfig)
    sampling: Sampling | None = None
    seed: int = 0
    model: str | None = None  # load_model's name: None = the default model, "tiny", a folder, ...
    device: str | None = None
    dtype: str | None = None
    threads: int = 1  # torch CPU threads in the worker
    concurrency: int = 16  # searches at once in the worker


def build_problem(problem: Any) -> Problem:
    """The Problem of a spec: the instance itself, or what the factory returns."""
    if isinstance(problem, Problem):
        return problem
    made = problem()
    if not isinstance(made, Problem):
        from treesearch.common.errors import ProblemDefinitionError

        raise ProblemDefinitionError(
            f"the problem factory {_name(problem)} returned {type(made).__name__}, not a "
            "treesearch.Problem; pass a Problem subclass, an instance, or a callable "
            "returning one"
        )
    return made


def _name(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


class SearchWorker:
    """One worker: one model, one engine and KV store, `spec.concurrency` searches at once."""

    def __init__(self, spec: WorkerSpec, name: str) -> None:
        t0 = time.perf_counter()
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch

        from treesearch.models.load import load_model
        from treesearch.search.searcher import Searcher

        torch.set_num_threads(spec.threads)
        model = load_model(spec.model, device=spec.device, dtype=spec.dtype)
        self.searcher = Searcher(
            model,
            build_problem(spec.problem),
            spec.strategy,
            spec.config,
            sampling=spec.sampling,
            seed=spec.seed,
            progress=False,
        )
        self.name = name
        self.spec = spec
        self._inbox: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"treesearch-{name}", daemon=True)
        self._thread.start()
        self.info = {
            "name": name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "device": str(model.device) if hasattr(model, "device") else spec.device or "cpu",
            "threads": spec.threads,
            "load_s": round(time.perf_counter() - t0, 3),
        }

    def ready(self) -> dict:
        """The worker's description; returns once the model is loaded (Ray runs __init__ first)."""
        return self.info

    def submit(self, items: list[tuple[Any, Any]]) -> int:
        """Queue (key, input) pairs for the search loop; returns how many wait now."""
        for item in items:
            self._inbox.put(item)
        return self._inbox.qsize()

    def take(self, wait_s: float = 1.0) -> list[tuple[Any, Any]]:
        """The results finished since the last call, waiting up to wait_s for the first. Raises
        the search loop's own error if it died (the driver then treats the worker as dead)."""
        out = []
        try:
            out.append(self._outbox.get(timeout=wait_s))
            while True:
                out.append(self._outbox.get_nowait())
        except queue.Empty:
            pass
        if not out and self._error is not None:
            raise self._error
        return out

    def _loop(self) -> None:
        from treesearch.search.many import solve_stream

        try:
            for key, result in solve_stream(self.searcher, self._inbox, concurrency=self.spec.concurrency):
                result.problem = None  # the driver has its own copy; trees pickle without KV handles
                result.worker = self.name
                self._outbox.put((key, result))
        except BaseException as exc:  # reported by take(); the driver re-queues this worker's inputs
            self._error = exc
