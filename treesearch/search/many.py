"""`solve_many`: a test set at batch speed -- up to `concurrency` searches at once over one engine
and one KV store, their rows batched together by the engine's scheduler (`treesearch.engine.scheduler`:
continuous batching, no barrier over the searches).

Each search runs its strategy in a thread of its own, on a copy of the Searcher whose backend is
the search's `SearchSession` (`treesearch.search.session`); the thread that iterates the results
starts searches and collects them. Results come back in input order, each as soon as it and
every earlier input are done. `solve_stream` is the same loop fed from a queue (a Ray worker's, see
`treesearch.runs.worker`): it takes inputs as they arrive and yields results as each finishes.
A search that raises is reported as a SearchResult with status "failed" and the error, holding
the part of its tree it had built; the other searches go on. Ctrl-C (or a caller that stops
iterating) stops every search; finished results were already yielded.

Problem and strategy objects are shared by the concurrent searches: their methods may run in
several threads at once, so they must not keep per-search state on themselves (the built-in
ones keep none: a strategy holds configuration, the tree holds the state).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator
from typing import Any

from treesearch.common.errors import SearchCancelled, TreeSearchError
from treesearch.search.session import SearchSession, Stop, session_priority

Searcher = Any  # treesearch.search.searcher.Searcher (it imports this module)
SearchResult = Any  # treesearch.search.result.SearchResult


def solve_many(searcher: Searcher, inputs: Iterable[Any], *, concurrency: int = 16) -> Iterator[SearchResult]:
    """Solve every input with `searcher`'s problem, strategy and settings, up to `concurrency`
    at a time over one shared engine; yields each input's SearchResult, in input order."""
    source = enumerate(inputs)
    loop = _solve(searcher, lambda block: next(source, _END), concurrency)
    done: dict[Hashable, SearchResult] = {}
    next_out = 0
    try:
        for i, result in loop:
            done[i] = result
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1
    finally:
        loop.close()  # stops the searches still running when the caller stops reading


def solve_stream(
    searcher: Searcher, inputs: queue.Queue, *, concurrency: int = 16
) -> Iterator[tuple[Hashable, SearchResult]]:
    """Like solve_many, for inputs that arrive while it runs (a Ray worker's): takes (key, input)
    pairs from the queue whenever fewer than `concurrency` searches are live, waits on it when
    none is, and yields (key, SearchResult) as each search finishes. A None in the queue ends
    the stream once the searches in flight are done."""

    def take(block: bool) -> Any:
        try:
            item = inputs.get(block=block)
        except queue.Empty:
            return _NONE_NOW
        return _END if item is None else item

    return _solve(searcher, take, concurrency)


_END, _NONE_NOW = object(), object()  # take(): no more inputs ever / none at the moment


def _solve(
    searcher: Searcher, take: Callable[[bool], Any], concurrency: int
) -> Generator[tuple[Hashable, SearchResult], None, None]:
    """The loop of both: take(block) gives the next (key, input), _NONE_NOW or _END; yields
    (key, SearchResult) as each search ends."""
    if concurrency < 1:
        from treesearch.common.errors import ConfigError

        raise ConfigError(f"concurrency={concurrency}; run at least 1 search at a time")
    engine = searcher.shared_engine()
    stop = Stop()
    ended: queue.Queue[_Run] = queue.Queue()
    sessions: dict[int, SearchSession] = {}
    engine.set_priority(session_priority(sessions))
    live: dict[Hashable, _Run] = {}
    more = True
    try:
        while True:
            while more and len(live) < concurrency:  # start searches up to the concurrency
                item = take(not live)  # with nothing running, wait for an input
                if item is _END:
                    more = False
                elif item is not _NONE_NOW:
                    key, x = item
                    session = SearchSession(engine, stop)
                    sessions[session.id] = session
                    live[key] = _Run(key, searcher, session, x, ended)
                    continue
                break
            if not live:
                if not more:
                    return
                continue
            run = ended.get()  # a search has finished
            live.pop(run.key)
            run.thread.join()
            run.session.close()
            del sessions[run.session.id]
            assert run.result is not None
            yield run.key, run.result
    finally:
        if live:
            stop.why = KeyboardInterrupt("the run was stopped")
            for run in live.values():
                run.session.cancel(stop.why)
            for run in live.values():
                run.thread.join()
                run.session.close()
        engine.set_priority(None)


class _Run:
    """One input's search, in a thread of its own; it puts itself on `ended` when done."""

    def __init__(self, key: Hashable, searcher: Searcher, session: SearchSession, x: Any, ended: queue.Queue):
        self.key = key
        self.session = session
        self.result: SearchResult | None = None
        self._child = searcher.for_backend(session)
        self._x = x
        self._ended = ended
        self.thread = threading.Thread(target=self._main, name=f"treesearch-search-{session.id}", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            try:
                self._child.problem.check_input(self._x)
            except TreeSearchError as exc:  # refused, no search: an "invalid" result, like the CLI run's rows
                self.result = _invalid(self._child, self._x, exc)
                return
            self.result = self._child._solve_checked(self._x)
        except SearchCancelled as exc:
            self.result = _failed(self._child, exc, status="interrupted")
        except BaseException as exc:  # reported on the search's own result; the others go on
            self.result = _failed(self._child, exc, status="failed")
        finally:
            self._ended.put(self)


def _invalid(child: Searcher, x: Any, exc: BaseException) -> SearchResult:
    """The result of an input `Problem.check_input` refused: status "invalid", the error, an empty
    tree and no model work."""
    child.engine = child.backend  # its session: the stats of no work
    child.tree.meta.update(problem=child.problem.name, input=str(x), input_type=type(x).__name__)
    return child.result(None, status="invalid", error=f"{type(exc).__name__}: {exc}"[:500])


def _failed(child: Searcher, exc: BaseException, *, status: str) -> SearchResult:
    """The partial result of a search that raised, marked with the error."""
    part = getattr(exc, "partial_result", None) or child.partial_result
    if part is None:
        if child.engine is None:  # raised before the search began (e.g. in initial_state)
            child.engine = child.backend
        part = child.result(None, status=status, error=f"{type(exc).__name__}: {exc}"[:500])
    part.status = status
    return part
