"""The culprit search, driven by fake checkers (no sessions, no models)."""

from __future__ import annotations

from bisect_onnx.search.attribution import CulpritSearch, LocalResult

FAILS = LocalResult(fails=True, excess=50.0)
NOISE = LocalResult(fails=True, excess=3.0, noise=True)
PASSES = LocalResult(fails=False, excess=0.5)


class FakeChecker:
    """Answers from a table and remembers every batch it was asked."""

    def __init__(self, table):
        self.table = table
        self.batches = []

    def __call__(self, names):
        self.batches.append(list(names))
        return {name: self.table.get(name) for name in names}


def test_a_first_value_that_introduces_the_error_is_the_culprit_after_one_check():
    checker = FakeChecker({"a": FAILS, "b": PASSES, "c": PASSES})
    found = CulpritSearch(["a", "b", "c"], checker).run()
    assert found.culprits == ["a"] and found.culprit == "a"
    assert checker.batches == [["a"]]  # nothing after it needed checking
    assert not found.drift


def test_an_innocent_first_failure_sends_the_search_on_to_the_real_culprit():
    checker = FakeChecker({"a": PASSES, "b": PASSES, "c": FAILS, "d": PASSES})
    found = CulpritSearch(["a", "b", "c", "d"], checker).run()
    assert found.culprit == "c"
    assert checker.batches == [["a"], ["b", "c", "d"]]
    assert found.checked["a"] is PASSES


def test_float_rounding_failures_are_noise_not_culprits():
    checker = FakeChecker({"a": NOISE, "b": PASSES, "c": FAILS})
    found = CulpritSearch(["a", "b", "c"], checker).run()
    assert found.culprit == "c"
    assert found.noise == ["a"]


def test_every_culprit_in_graph_order_with_everything():
    table = {"a": FAILS, "b": PASSES, "c": NOISE, "d": FAILS, "e": PASSES}
    checker = FakeChecker(table)
    found = CulpritSearch(list(table), checker).run(everything=True)
    assert found.culprits == ["a", "d"]
    assert set(found.checked) == set(table)


def test_no_culprit_and_every_value_checked_is_a_drift_named_by_its_largest_jump():
    checker = FakeChecker({"a": LocalResult(False, 0.2), "b": LocalResult(False, 0.9),
                           "c": NOISE})
    found = CulpritSearch(["a", "b", "c"], checker).run()
    assert found.culprits == [] and found.culprit is None
    assert found.drift and found.largest_jump == "c"


def test_an_unchecked_value_rules_out_calling_it_a_drift():
    checker = FakeChecker({"a": PASSES, "b": None})
    found = CulpritSearch(["a", "b"], checker).run()
    assert found.culprits == [] and not found.drift
    assert found.checked == {"a": PASSES, "b": None}


def test_nothing_failing_checks_nothing():
    checker = FakeChecker({})
    found = CulpritSearch([], checker).run(everything=True)
    assert found.culprits == [] and checker.batches == [] and not found.drift
