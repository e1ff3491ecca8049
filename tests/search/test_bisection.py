"""The probe search alone, driven by fake probes (no sessions)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bisect_onnx.search.bisection import ProbeSearch
from bisect_onnx.search.value_graph import ValueGraph


def chain(count):
    """``input -> v0 -> ... -> v{count-1} -> out``: one path, every value a cut."""
    previous, nodes = "input", []
    for index in range(count):
        nodes.append(("Op", [previous], [f"v{index}"]))
        previous = f"v{index}"
    nodes.append(("Op", [previous], ["out"]))
    return ValueGraph.from_nodes(nodes, ["input"])


def search_chain(count, **options):
    return ProbeSearch(chain(count), names(count), failing=["out"], **options)


def fake_probe(first_bad: int, *, uncomparable=(), log=None):
    """Checkpoints ``v0..vN``: those from ``first_bad`` on fail."""

    def probe(names):
        if log is not None:
            log.append(list(names))
        return {name: None if int(name[1:]) in uncomparable else int(name[1:]) >= first_bad
                for name in names}

    return probe


def names(count):
    return [f"v{index}" for index in range(count)]


@pytest.mark.parametrize("first_bad", [0, 1, 500, 998, 999])
def test_the_first_failing_checkpoint_is_found_in_log2_probes(first_bad):
    log = []
    search = search_chain(1000).run(fake_probe(first_bad, log=log))
    assert search.first_failing == f"v{first_bad}"
    assert search.last_passing == (f"v{first_bad - 1}" if first_bad else None)
    assert len(log) <= math.ceil(math.log2(1001))
    assert all(len(values) == 1 for values in log)  # one value marked per probe


def test_no_checkpoint_fails_when_only_the_outputs_do():
    search = search_chain(50).run(fake_probe(10**6))
    assert search.first_failing is None and search.last_passing == "v49"


def test_several_values_per_probe_take_fewer_probes():
    single, triple = [], []
    search_chain(1000).run(fake_probe(321, log=single))
    found = search_chain(1000, per_probe=3).run(fake_probe(321, log=triple))
    assert found.first_failing == "v321"
    assert len(triple) < len(single) and all(len(values) <= 3 for values in triple)
    assert len(triple) <= math.ceil(math.log(1001, 4)) + 1


def test_uncomparable_neighbours_are_skipped_and_reported():
    search = search_chain(100).run(fake_probe(40, uncomparable={38, 39}))
    assert search.first_failing == "v40" and search.last_passing == "v37"
    assert search.uncompared_between == ["v38", "v39"]


def test_nothing_to_probe_without_checkpoints():
    search = ProbeSearch(chain(3), [], failing=["out"])
    assert search.done and search.next_probe() == []
    assert search.first_failing is None and search.last_passing is None


def test_each_probe_is_recorded_with_its_results():
    search = search_chain(8).run(fake_probe(5))
    assert search.probes and all(set(probe.results) == set(probe.values)
                                 for probe in search.probes)
    assert {name for probe in search.probes for name, fails in probe.results.items()
            if fails} >= {"v5"}


@given(st.integers(min_value=1, max_value=300), st.data())
def test_any_monotonic_failure_is_located_exactly(count, data):
    first_bad = data.draw(st.integers(min_value=0, max_value=count))
    per_probe = data.draw(st.integers(min_value=1, max_value=4))
    skipped = set(data.draw(st.lists(st.integers(0, count - 1), max_size=5)))
    search = search_chain(count, per_probe=per_probe).run(
        fake_probe(first_bad, uncomparable=skipped))
    # The answer brackets the true first failure, with only uncomparable values between.
    high = count if search.first_failing is None else int(search.first_failing[1:])
    low = -1 if search.last_passing is None else int(search.last_passing[1:])
    assert low < first_bad <= high
    assert all(int(name[1:]) in skipped for name in search.uncompared_between)
    if first_bad not in skipped and first_bad < count:
        assert search.first_failing == f"v{first_bad}"


def test_per_probe_must_be_positive():
    with pytest.raises(ValueError):
        search_chain(3, per_probe=0)
