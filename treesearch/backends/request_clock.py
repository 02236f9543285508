"""How long the server backend waits on HTTP, and what the server says it spent: a `RequestClock`
that `ServerClient` runs around every HTTP round trip (so the bench can tell the run's time spent
outside any round trip, in our own code, from the server's), and the `timings` llama.cpp's server
puts in each completion answer (tokens it evaluated, and milliseconds, for the prompt and for
generation), summed.

Definitions (`ClientTimes`):
- requests: HTTP round trips (retries count each attempt); request_s: their durations summed
  (overlapping round trips each count, so it can exceed the wall time);
- busy_s: seconds during which at least one round trip was in flight (the union of their intervals);
  `outside(times, wall_s)` is then wall_s - busy_s: time no request was in flight, i.e. our own code
  (the search, prompt building, reading answers) with the server idle as far as we are concerned;
- timed: answers that carried llama.cpp's `timings`; prompt_n / prompt_ms: prompt tokens the server
  evaluated (its cached tokens left out) and the time it took; predicted_n / predicted_ms: the
  same for generated tokens. Each slot reports its own times, so under `--parallel N` batching the
  per-second rates are per request (a slot's view), not the server's total throughput.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ClientTimes:
    """What a `RequestClock` counted up to one moment (see the module docstring)."""

    requests: int = 0
    request_s: float = 0.0
    busy_s: float = 0.0
    timed: int = 0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0

    def since(self, earlier: ClientTimes) -> ClientTimes:
        """What was counted between `earlier` and this snapshot."""
        return ClientTimes(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in dataclasses.fields(self)}
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class RequestClock:
    """Thread-safe timer of HTTP round trips (`with clock.round_trip(): ...`) and sum of llama.cpp's
    per-answer `timings` (`add_timings`). `clock` is the time source (seconds), for tests."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._now = clock
        self._lock = threading.Lock()
        self._in_flight = 0
        self._busy_since = 0.0
        self._times = ClientTimes()

    @contextmanager
    def round_trip(self) -> Iterator[None]:
        """Time one HTTP round trip (the block), also when it raises."""
        with self._lock:
            start = self._now()
            if self._in_flight == 0:
                self._busy_since = start
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                end = self._now()
                self._in_flight -= 1
                t = self._times
                busy = t.busy_s + (end - self._busy_since if self._in_flight == 0 else 0.0)
                self._times = dataclasses.replace(
                    t, requests=t.requests + 1, request_s=t.request_s + (end - start), busy_s=busy
                )

    def add_timings(self, answer: Any) -> None:
        """Add an answer's llama.cpp `timings` (prompt_n, prompt_ms, predicted_n, predicted_ms);
        an answer without them (another server) changes nothing."""
        timings = answer.get("timings") if isinstance(answer, dict) else None
        if not isinstance(timings, dict):
            return
        try:
            pn, pms = int(timings.get("prompt_n") or 0), float(timings.get("prompt_ms") or 0.0)
            gn, gms = int(timings.get("predicted_n") or 0), float(timings.get("predicted_ms") or 0.0)
        except (TypeError, ValueError):
            return
        with self._lock:
            t = self._times
            self._times = dataclasses.replace(
                t,
                timed=t.timed + 1,
                prompt_n=t.prompt_n + pn,
                prompt_ms=t.prompt_ms + pms,
                predicted_n=t.predicted_n + gn,
                predicted_ms=t.predicted_ms + gms,
            )

    def snapshot(self) -> ClientTimes:
        """The counts so far; a round trip still in flight counts as busy up to now."""
        with self._lock:
            t = self._times
            if self._in_flight:
                t = dataclasses.replace(t, busy_s=t.busy_s + self._now() - self._busy_since)
            return t


def per_second(tokens: int, ms: float) -> float | None:
    """tokens / (ms / 1000), or None without time."""
    return tokens * 1000.0 / ms if ms > 0 else None


def outside(times: ClientTimes, wall_s: float) -> dict[str, Any]:
    """The run's time outside any HTTP round trip (our own code), in total and per request, and
    llama.cpp's prompt and generation tokens per second (None where it reported no timings)."""
    out_s = max(0.0, wall_s - times.busy_s)
    return {
        **times.as_dict(),
        "wall_s": wall_s,
        "outside_s": out_s,
        "outside_share": out_s / wall_s if wall_s > 0 else None,
        "outside_per_request_ms": 1000.0 * out_s / times.requests if times.requests else None,
        "server_prompt_per_second": per_second(times.prompt_n, times.prompt_ms) if times.timed else None,
        "server_predicted_per_second": (
            per_second(times.predicted_n, times.predicted_ms) if times.timed else None
        ),
    }
