"""Large allocations served from the heap while kept, and given back after.

Each case runs in a process of its own: glibc's malloc options are the whole process's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fixtures.registry import REPO_ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="glibc's malloc options")

SCRIPT = """
import json, sys
import numpy as np
from bisect_onnx.runtime import heap

MIB = 1 << 20

def in_heap(array):
    address = array.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, *rest = line.split()
            start, end = (int(part, 16) for part in span.split("-"))
            if start <= address < end:
                return rest[-1] == "[heap]"
    return False

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 // MIB

def touched(mib):
    array = np.empty(mib * MIB, dtype=np.uint8)
    array[::4096] = 1
    return array

found = {"before": in_heap(touched(64))}
with heap.kept_in_heap(active=sys.argv[1] == "yes"):
    found["kept_not_made"] = in_heap(touched(64))  # a session's run: maps as usual
    with heap.made_in_heap():  # a session's making
        found["inside"] = in_heap(touched(64))
        big = touched(512)  # what the session holds
        found["big_inside"] = in_heap(big)
        transient = touched(256)  # what its making frees
        del transient
        made = resident()
    found["making_given_back"] = made - resident()
    base = resident()
    del big  # the session released
found["dropped"] = base - resident()
reused = touched(256)  # the weights read back, into the pages the session freed
found["reused"] = in_heap(reused)
del reused
found["kept_reused"] = in_heap(touched(64))
before_giving = resident()
heap.give_back()
found["given_back"] = before_giving - resident()
found["after"] = in_heap(touched(64))
print(json.dumps(found))
"""


def _run(active: str, env: dict[str, str] | None = None) -> dict:
    result = subprocess.run([sys.executable, "-c", SCRIPT, active], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_allocations_stay_in_the_heap_and_its_pages_are_reused():
    found = _run("yes")
    assert not found["before"]  # 64 MiB: a map of its own, as glibc does by default
    assert not found["kept_not_made"]
    assert found["inside"] and found["big_inside"]
    assert found["making_given_back"] > 200
    assert found["dropped"] < 100  # the 512 MiB freed inside are not given back yet...
    assert found["reused"] and found["kept_reused"]  # ...and later large allocations reuse them
    assert found["given_back"] > 400  # until the run gives them back
    assert not found["after"]  # then glibc maps large allocations again


def test_a_small_model_changes_nothing():
    found = _run("no")
    assert not any(found[key] for key in ("before", "kept_not_made", "inside", "big_inside",
                                          "reused", "kept_reused", "after"))
    assert found["dropped"] > 400  # freed at once, as glibc does by default


def test_the_callers_own_malloc_options_are_left_alone():
    found = _run("yes", env={"MALLOC_ARENA_MAX": "2"})
    assert not found["inside"] and not found["big_inside"]
    assert found["dropped"] > 400
