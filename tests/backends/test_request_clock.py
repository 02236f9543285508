"""The client's time accounting (`treesearch.backends.request_clock`): busy time is the union of the
HTTP round trips, the run's time outside them is the rest, llama.cpp's `timings` are summed, and the
bench reports them for a server run (`treesearch.bench.engines`). A hand-driven clock gives exact
times; one test times real round trips to a scripted server."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treesearch.backends.request_clock import ClientTimes, RequestClock, outside
from treesearch.bench.engines import server_times_lines, timed_run
from treesearch.bench.results import RunResult


class HandClock:
    """Time that moves only when told to."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_overlapping_round_trips_count_once_in_busy_time_and_each_in_request_time():
    now = HandClock()
    clock = RequestClock(now)
    with ExitStack() as first:
        now.t = 1.0
        first.enter_context(clock.round_trip())  # 1.0 .. 4.0
        now.t = 2.0
        with clock.round_trip():  # 2.0 .. 3.0, inside the first
            now.t = 3.0
        now.t = 4.0
    now.t = 6.0
    with clock.round_trip():  # 6.0 .. 6.5, after a gap of 2 s
        now.t = 6.5
    t = clock.snapshot()
    assert (t.requests, t.request_s, t.busy_s) == (3, 4.5, 3.5)
    o = outside(t, wall_s=7.0)
    assert o["outside_s"] == 3.5 and o["outside_share"] == 0.5
    assert o["outside_per_request_ms"] == pytest.approx(1000 * 3.5 / 3)


def test_a_round_trip_that_raises_is_still_timed():
    now = HandClock()
    clock = RequestClock(now)
    with pytest.raises(ConnectionError), clock.round_trip():
        now.t = 0.25
        raise ConnectionError("refused")
    assert clock.snapshot() == ClientTimes(requests=1, request_s=0.25, busy_s=0.25)


def test_a_snapshot_in_flight_counts_busy_up_to_now_and_differences_add_up():
    now = HandClock()
    clock = RequestClock(now)
    with clock.round_trip():
        now.t = 2.0
        mid = clock.snapshot()
        now.t = 5.0
    end = clock.snapshot()
    assert (mid.requests, mid.busy_s) == (0, 2.0)
    assert end.since(mid) == ClientTimes(requests=1, request_s=5.0, busy_s=3.0)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 20)), min_size=1, max_size=12))
def test_busy_time_is_the_length_of_the_union_of_the_intervals(spans):
    """Round trips [start, start + length) opened and closed in time order, overlapping at will."""
    events = sorted(
        [(s, 1, i) for i, (s, n) in enumerate(spans)] + [(s + n, 0, i) for i, (s, n) in enumerate(spans)]
    )
    now = HandClock()
    clock = RequestClock(now)
    open_trips: dict[int, ExitStack] = {}
    for t, opening, i in events:  # closings (0) sort before openings (1) at the same instant
        now.t = float(t)
        if opening:
            open_trips[i] = ExitStack()
            open_trips[i].enter_context(clock.round_trip())
        else:
            open_trips.pop(i).close()
    covered = {x for s, n in spans for x in range(s, s + n)}  # unit cells of the union
    got = clock.snapshot()
    assert got.busy_s == len(covered)
    assert got.request_s == sum(n for _, n in spans) and got.requests == len(spans)


def test_llama_cpp_timings_are_summed_and_answers_without_them_change_nothing():
    clock = RequestClock(HandClock())
    clock.add_timings({"timings": {"prompt_n": 10, "prompt_ms": 20.0, "predicted_n": 4, "predicted_ms": 8.0}})
    clock.add_timings({"timings": {"prompt_n": 2, "prompt_ms": 5.0, "predicted_n": 1, "predicted_ms": 2.0}})
    clock.add_timings({"usage": {"prompt_tokens": 3}})  # vLLM: no timings
    clock.add_timings({"timings": {"prompt_n": "many"}})  # malformed: ignored
    t = clock.snapshot()
    assert (t.timed, t.prompt_n, t.prompt_ms, t.predicted_n, t.predicted_ms) == (2, 12, 25.0, 5, 10.0)
    o = outside(t, wall_s=1.0)
    assert o["server_prompt_per_second"] == pytest.approx(12 / 0.025)
    assert o["server_predicted_per_second"] == pytest.approx(5 / 0.010)
    assert outside(ClientTimes(), 1.0)["server_prompt_per_second"] is None


class TimedBackend:
    """A backend's `times()` as ServerEngine gives it: a counter that a run moves on."""

    def __init__(self) -> None:
        self.now = ClientTimes(requests=5, request_s=9.0, busy_s=9.0)

    def times(self) -> ClientTimes:
        return self.now


def test_timed_run_records_only_the_runs_own_round_trips_and_the_report_prints_them():
    backend = TimedBackend()

    def run() -> RunResult:
        backend.now = ClientTimes(
            requests=9,
            request_s=15.0,
            busy_s=12.6,
            timed=4,
            prompt_n=400,
            prompt_ms=100.0,
            predicted_n=40,
            predicted_ms=400.0,
        )
        return RunResult(wall_s=4.0)

    result = timed_run(backend, run)
    server = result.server
    assert server is not None
    assert (server["requests"], server["busy_s"], server["wall_s"]) == (4, pytest.approx(3.6), 4.0)
    assert server["outside_s"] == pytest.approx(0.4) and server["outside_share"] == pytest.approx(0.1)
    assert server["outside_per_request_ms"] == pytest.approx(100.0)
    assert timed_run(object(), lambda: RunResult(wall_s=1.0)).server is None  # a local engine: nothing
    modes = {"exact": {"computed_tokens": 880, "wall_s": 2.0}, "server": {"server_times": server}}
    assert server_times_lines(modes) == [
        "",
        "Server client times:",
        "- server: 4 HTTP round trips, in flight 3.60 s of the run's 4.00 s; outside them (our own code) "
        "0.40 s = 10.0% of the run, 100.00 ms per request; llama-server's timings: prompt 400 tokens at "
        "4000 tok/s, generation 40 tokens at 100.0 tok/s (per request, as each slot reports), 110 tokens "
        "evaluated per second of the run",
        "- ours (exact): 880 tokens computed (prefill + decode) = 440 per second of its run (the bench does "
        "not time prefill and decode apart)",
    ]


def test_the_client_times_each_round_trip_to_a_real_http_server():
    pytest.importorskip("httpx")
    from fake_servers import ScriptedServer, completion

    from treesearch.backends.http import ServerClient

    with ScriptedServer(lambda path, body: (200, completion(["ok"])), delay=0.05) as srv:
        client = ServerClient(srv.url)
        for _ in range(3):
            client.post("/v1/completions", {"prompt": "x"})
        client.close()
    t = client.clock.snapshot()
    assert t.requests == 3 and t.busy_s == pytest.approx(t.request_s)
    assert t.request_s >= 3 * 0.05  # each waited for the server's delay
