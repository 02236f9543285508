"""A test set over many Ray workers: `run_distributed` and `DistributedRun`.

    from treesearch import run_distributed
    from treesearch.tasks.game24 import Game24, load_puzzles
    for result in run_distributed(Game24, load_puzzles(900, 1000), workers=4, concurrency=16):
        print(result.tree.meta["input"], result.answer, result.solved, result.worker)

Each worker is a Ray actor (`treesearch.runs.worker.SearchWorker`) holding one model and one
engine, running up to `concurrency` searches at once (`solve_stream`). The driver keeps the
queue: it hands each worker inputs in small batches (`batch`) whenever the worker has fewer than
`concurrency` unfinished, so a fast worker takes more, and collects results as they finish.

Faults. The driver knows which inputs each worker holds. A worker that dies (killed, out of
memory, its machine gone) loses nothing: its unfinished inputs go back to the front of the queue
for the other workers, and a replacement worker is started (at most `max_restarts` in a run).
A result is yielded once per input, whatever happens: an input is handed out again only when its
worker died before returning it, and a second result for an input would be dropped. When no
worker is left, DistributedError names the inputs not run.

What travels: the problem (a Problem instance, or a zero-argument factory such as the Problem
class) and the strategy are pickled by Ray's cloudpickle and rebuilt in every worker, so their
classes must be importable there (defined at module level in a module on the workers' path, or
in the driver's script) and must hold nothing that cannot be pickled (locks, open files, loaded
models): `check_sendable` says so, naming the class, before anything starts. The model travels
by name (`model=`: None for the default, "tiny", a folder) and is loaded by each worker. Results
come back as SearchResults with their trees (without KV handles) and `worker` set.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.common.errors import ConfigError, DistributedError
from treesearch.runs.cluster import Cluster, connect, require_ray
from treesearch.runs.worker import SearchWorker, WorkerSpec, build_problem

log = logging.getLogger(__name__)
START_TIMEOUT_S = 600.0  # how long start() waits for every first worker to load its model


def run_distributed(
    problem_factory: Any, inputs: Iterable[Any], *, workers: int = 2, ordered: bool = True, **options: Any
) -> Iterator[Any]:
    """Solve every input on `workers` Ray workers; yields each input's SearchResult, in input
    order (ordered=True, like solve_many) or as each finishes (ordered=False). Options are
    DistributedRun's (strategy, config, sampling, seed, model, device, threads, concurrency,
    address, ...). Checks everything it can (Ray installed, problem and strategy sendable) now,
    before the first result is asked for."""
    run = DistributedRun(problem_factory, workers=workers, **options)
    return _results(run, list(inputs), ordered)


def _results(run: DistributedRun, xs: list[Any], ordered: bool) -> Iterator[Any]:
    with run:
        done: dict[Hashable, Any] = {}
        next_out = 0
        for i, _, result in run.solve_items(enumerate(xs)):
            if not ordered:
                yield result
                continue
            done[i] = result
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1


@dataclass(eq=False)
class _Slot:
    """One worker as the driver sees it."""

    name: str
    actor: Any
    ready_ref: Any
    ready: bool = False
    poll_ref: Any = None
    assigned: dict = field(default_factory=dict)  # key -> input handed to it, not returned yet
    finished: int = 0


class DistributedRun:
    """A run over Ray workers: start() connects to (or starts) the cluster and the workers,
    solve_items() yields (key, input, SearchResult) as each finishes, close() stops the workers
    (and a cluster it started). Also a context manager.

    threads: torch threads per worker (default cpus_per_worker); cpus_per_worker / gpus_per_worker:
    what Ray reserves for each worker (num_cpus / num_gpus; a GPU worker defaults to device
    "cuda"); batch: inputs handed over at a time (default concurrency // 4, 1 to 8);
    address: None for a local cluster of workers x cpus_per_worker CPUs, "auto" or HOST:PORT."""

    def __init__(
        self,
        problem_factory: Any,
        *,
        workers: int = 2,
        strategy: Any = None,
        config: RKSCConfig | None = None,
        sampling: Sampling | None = None,
        seed: int = 0,
        model: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        threads: int | None = None,
        cpus_per_worker: float = 1,
        gpus_per_worker: float = 0,
        concurrency: int = 16,
        batch: int | None = None,
        address: str | None = None,
        max_restarts: int | None = None,
        poll_s: float = 1.0,
    ) -> None:
        require_ray()
        for name, value in (
            ("workers", workers),
            ("concurrency", concurrency),
            ("batch", batch or 1),
            ("threads", threads or 1),
        ):
            if value < 1:
                raise ConfigError(f"{name}={value}; use at least 1")
        if gpus_per_worker < 0 or cpus_per_worker < 0:
            raise ConfigError(
                "cpus_per_worker and gpus_per_worker are what Ray reserves per worker; use 0 or more"
            )
        from treesearch.core.problem import check_problem
        from treesearch.search.checks import check_problem_instance, check_strategy

        if strategy is None:
            from strategies import BFS

            strategy = BFS()
        check_strategy(strategy)
        self.problem = build_problem(problem_factory)  # the driver's copy: input checks, results' problem
        check_problem_instance(self.problem)
        check_problem(self.problem)
        check_sendable(problem_factory, "problem")
        check_sendable(strategy, "strategy")
        self.spec = WorkerSpec(
            problem=problem_factory,
            strategy=strategy,
            config=config or RKSCConfig(),
            sampling=sampling,
            seed=seed,
            model=model,
            device=device or ("cuda" if gpus_per_worker > 0 else None),
            dtype=dtype,
            threads=threads or max(1, int(cpus_per_worker)),
            concurrency=concurrency,
        )
        self.workers, self.concurrency = workers, concurrency
        self.batch = batch or max(1, min(8, concurrency // 4))
        self.cpus_per_worker, self.gpus_per_worker = cpus_per_worker, gpus_per_worker
        self.address = address
        self.max_restarts = workers if max_restarts is None else max_restarts
        self.poll_s = poll_s
        self.cluster: Cluster | None = None
        self.restarts = 0  # replacement workers started for dead ones
        self.requeued: dict[Hashable, str] = {}  # input key -> the dead worker it was taken back from
        self.info: dict[str, dict] = {}  # worker name -> its ready() description
        self.workers_ready_s = 0.0  # from the first actor requested to every first worker ready
        self._slots: dict[str, _Slot] = {}
        self._names = (f"worker-{k}" for k in itertools.count())
        self._actor_class: Any = None

    # -- starting and stopping ----------------------------------------------------------------------
    def start(self) -> DistributedRun:
        """Connect to the cluster and start the workers; returns once every one has its model."""
        ray = require_ray()
        if self.cluster is None:
            local_cpus = max(1, round(self.workers * max(self.cpus_per_worker, 1)))
            self.cluster = connect(self.address, num_cpus=local_cpus if self.address is None else None)
        t0 = time.perf_counter()
        self._actor_class = ray.remote(SearchWorker)
        for _ in range(self.workers):
            self._spawn()
        refs = {s.ready_ref: s for s in self._slots.values()}
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=START_TIMEOUT_S)
        for ref in done:
            self._mark_ready(refs[ref], ref)
        if not any(s.ready for s in self._slots.values()):
            raise DistributedError(
                f"no worker started within {START_TIMEOUT_S:g} s; the cluster may lack the "
                f"{self.cpus_per_worker} CPUs / {self.gpus_per_worker} GPUs each worker asks for"
            )
        self.workers_ready_s = time.perf_counter() - t0
        return self

    def close(self) -> None:
        """Stop every worker; shut the cluster down if this run started it."""
        if self._slots:
            ray = require_ray()
            for s in self._slots.values():
                try:
                    ray.kill(s.actor)
                except Exception:  # already gone
                    pass
            self._slots.clear()
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None

    def __enter__(self) -> DistributedRun:
        if self.cluster is None or not self._slots:
            try:
                self.start()
            except BaseException:  # Ctrl-C or a worker that cannot start: stop the ones that did
                self.close()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def actors(self) -> dict[str, Any]:
        """The live workers' Ray actor handles by name (to watch them, or to kill one in a test)."""
        return {name: s.actor for name, s in self._slots.items()}

    def holding(self) -> dict[str, list]:
        """The keys each live worker holds unfinished, as far as the driver knows: a result the
        worker sent just before it died still counts (it is kept, and not run again)."""
        return {name: list(s.assigned) for name, s in self._slots.items()}

    # -- the run ----------------------------------------------------------------------------------------
    def solve_items(self, items: Iterable[tuple[Hashable, Any]]) -> Iterator[tuple[Hashable, Any, Any]]:
        """Solve (key, input) pairs over the workers; yields (key, input, SearchResult) as each
        finishes, each key once (see the module docstring for what happens when a worker dies)."""
        if self.cluster is None or not self._slots:
            self.start()
        ray = require_ray()
        from ray.exceptions import RayActorError, RayTaskError

        pending = deque(items)
        returned: set = set()
        while pending or any(s.assigned for s in self._slots.values()):
            self._feed(pending)
            waits: dict[Any, _Slot] = {}
            for s in self._slots.values():
                if not s.ready:
                    waits[s.ready_ref] = s
                    continue
                if s.poll_ref is None:
                    s.poll_ref = s.actor.take.remote(self.poll_s)
                waits[s.poll_ref] = s
            done, _ = ray.wait(list(waits), num_returns=1, timeout=self.poll_s + 5)
            for ref in done:
                s = waits[ref]
                if not s.ready:
                    self._mark_ready(s, ref)
                    continue
                s.poll_ref = None
                try:
                    batch = ray.get(ref)
                except (RayActorError, RayTaskError) as exc:
                    self._lost(s, exc, pending)
                    continue
                rows = []  # the whole reply leaves `assigned` before the first yield: holding() stays true
                for key, result in batch:
                    x = s.assigned.pop(key, _MISSING)
                    if x is _MISSING or key in returned:  # never twice
                        continue
                    returned.add(key)
                    s.finished += 1
                    result.problem = self.problem
                    rows.append((key, x, result))
                yield from rows

    def _feed(self, pending: deque) -> None:
        """Hand out inputs, `batch` at a time, to the ready workers with the fewest unfinished,
        up to `concurrency` each."""
        while pending:
            open_slots = sorted(
                (s for s in self._slots.values() if s.ready and len(s.assigned) < self.concurrency),
                key=lambda s: len(s.assigned),
            )
            if not open_slots:
                return
            for s in open_slots:
                n = min(self.batch, self.concurrency - len(s.assigned), len(pending))
                if n <= 0:
                    continue
                batch = [pending.popleft() for _ in range(n)]
                s.assigned.update(batch)
                s.actor.submit.remote(batch)

    def _spawn(self) -> _Slot:
        name = next(self._names)
        actor = self._actor_class.options(
            num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker, max_concurrency=4, max_restarts=0
        ).remote(self.spec, name)
        slot = _Slot(name=name, actor=actor, ready_ref=actor.ready.remote())
        self._slots[name] = slot
        return slot

    def _mark_ready(self, s: _Slot, ref: Any) -> None:
        """A worker's ready() answered: it has its model, or it could not start (DistributedError)."""
        from ray.exceptions import RayActorError, RayTaskError

        ray = require_ray()
        try:
            self.info[s.name] = ray.get(ref)
        except (RayActorError, RayTaskError) as exc:
            self._slots.pop(s.name, None)
            if any(o.ready for o in self._slots.values()):  # a replacement that failed: the others go on
                log.warning("%s could not start: %s", s.name, start_error(exc))
                return
            raise DistributedError(f"{s.name} could not start: {start_error(exc)}") from None
        s.ready = True

    def _lost(self, s: _Slot, exc: BaseException, pending: deque) -> None:
        """A worker died: its unfinished inputs go back to the front of the queue; start a
        replacement while restarts are left; DistributedError when no worker is left."""
        ray = require_ray()
        self._slots.pop(s.name, None)
        try:
            ray.kill(s.actor)  # a worker whose search loop failed may still be running
        except Exception:
            pass
        pending.extendleft(reversed(list(s.assigned.items())))
        self.requeued.update(dict.fromkeys(s.assigned, s.name))
        why = _last_line(exc)
        log.warning(
            "%s died (%s); its %d unfinished inputs go back to the queue", s.name, why, len(s.assigned)
        )
        if self.restarts < self.max_restarts:
            self.restarts += 1
            new = self._spawn()
            log.warning("started %s in its place", new.name)
        elif not self._slots:
            keys = [k for k, _ in pending]
            raise DistributedError(
                f"every worker died (the last: {why}); {len(keys)} inputs were not run "
                f"({', '.join(map(str, keys[:10]))}{', ...' if len(keys) > 10 else ''}); "
                "rerun them (treesearch run --resume does), with more memory per worker"
            )


_MISSING = object()


def check_sendable(obj: Any, what: str) -> None:
    """The problem / strategy can be pickled for the workers (Ray's cloudpickle), else a
    DistributedError naming its class and the fix."""
    from ray import cloudpickle

    try:
        cloudpickle.dumps(obj)
    except Exception as exc:
        cls = obj.__qualname__ if isinstance(obj, type) else type(obj).__qualname__
        raise DistributedError(
            f"the {what} {cls} cannot be sent to the Ray workers ({type(exc).__name__}: {_last_line(exc)}); "
            "define "
            f"{cls} at module level in a module the workers can import, and keep nothing on it that cannot "
            "be "
            "pickled (locks, open files, threads, loaded models: build those inside its methods)"
        ) from None


def start_error(exc: BaseException) -> str:
    """The one line that says why a worker could not start (the exception its __init__ raised)."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [
        ln for ln in lines if ("Error" in ln.split(":")[0] or "Exception" in ln.split(":")[0]) and ":" in ln
    ]
    line = errors[-1] if errors else (lines[-1] if lines else type(exc).__name__)
    if "ModuleNotFoundError" in line:
        line += (
            "; the module of the problem or strategy must be importable on every worker (install it there, "
            "or put it on PYTHONPATH)"
        )
    return line[:400]


def _last_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:200]
