"""`treesearch.engine.pins`: on an engine that searches share, the root prompts' pins go before a
call fails; a search alone on its own engine keeps its pin; a row queued before they went no
longer has to keep its prompt cached."""

from __future__ import annotations

from treesearch import Engine, RKSCConfig
from treesearch.cache.manager import Row
from treesearch.engine.pins import loosen_pins, must_store


def test_a_search_alone_keeps_its_pin_and_an_engine_searches_share_loosens_every_pin(tiny_lm):
    eng = Engine(tiny_lm, RKSCConfig(cache_budget=10**6))
    eng.pin_owner("root")
    assert not loosen_pins(eng) and eng.cache.prompt_pinned("root")  # no search shares the engine
    stats = eng.begin_search()  # one of the searches sharing it (solve_many, run, a Ray worker)
    eng.pin_owner(("s2", "root"))
    assert loosen_pins(eng)
    assert not eng.cache.prompt_pinned("root") and not eng.cache.prompt_pinned(("s2", "root"))
    assert not loosen_pins(eng)  # nothing left to unpin
    eng.end_search(stats)
    eng.pin_owner("later")  # a search started later pins its prompt again
    assert eng.cache.prompt_pinned("later") and not loosen_pins(eng)


def test_a_row_queued_before_the_pins_went_no_longer_must_keep_its_prompt(tiny_lm):
    eng = Engine(tiny_lm, RKSCConfig(cache_budget=10**6))
    eng.begin_search()
    eng.pin_owner("root")
    row = Row(ids=[1, 2, 3], must_store=True)
    assert must_store(eng.cache, row, "root") and not must_store(eng.cache, row, "other")
    assert loosen_pins(eng)
    assert not must_store(eng.cache, row, "root")
