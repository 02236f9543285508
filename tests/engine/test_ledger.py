"""`treesearch.engine.ledger.SearchLedger`: the searches an engine serves, tested directly."""

from __future__ import annotations

from treesearch.common.stats import Stats
from treesearch.engine.ledger import SearchLedger


def test_each_search_gets_its_own_stats_and_a_fresh_key():
    ledger = SearchLedger()
    a, b = ledger.begin(), ledger.begin()
    assert a is not b and isinstance(a, Stats)
    assert ledger.key(a) != ledger.key(b)
    assert ledger.live_keys() == {ledger.key(a), ledger.key(b)}


def test_distinct_contexts_are_counted_per_search():
    ledger = SearchLedger()
    a, b = ledger.begin(), ledger.begin()
    ledger.saw(a, [1, 2, 3])
    ledger.saw(a, [1, 2, 4])
    ledger.saw(b, [1, 2, 3])
    assert (ledger.unique(a), ledger.unique(b)) == (4, 3)


def test_an_ended_search_is_forgotten_and_its_key_returned_once():
    ledger = SearchLedger()
    a, b = ledger.begin(), ledger.begin()
    key = ledger.key(a)
    assert ledger.end(a) == key
    assert ledger.end(a) is None  # ended already
    assert ledger.live_keys() == {ledger.key(b)}


def test_stats_never_begun_are_taken_in_on_first_use():
    ledger = SearchLedger()
    mine = Stats()
    k = ledger.key(mine)
    assert ledger.key(mine) == k and k in ledger.live_keys()
    assert ledger.end(Stats()) is None  # never seen: nothing to end
