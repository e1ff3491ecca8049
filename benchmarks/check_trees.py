"""A check's time in two checkouts of bisect-onnx, alternately, against the in-place floor.

The archives and files ``benchmarks/reference_archive.py`` made (``WORKDIR/<model>.npz``
and ``.onnx``) are checked by each checkout in a process of its own, one untimed check
first, then ``--reps`` checks, each followed by the floor with its weights in place
(``reference_archive.floor``, as that checkout computes it); the checkouts take turns
for ``--rounds`` rounds, so that the machine's load falls on both alike. Printed per
round: the best and median seconds of the checks and of the floors, and their ratio.
Run::

    git worktree add /tmp/before <commit>
    python benchmarks/check_trees.py /tmp/before . --workdir /tmp/reference-bench
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_ONE_PROCESS = r'''
import json, sys, time, warnings
from pathlib import Path
tree, workdir, name, reps = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sys.path[:0] = [tree, tree + "/benchmarks"]
warnings.simplefilter("ignore")
import bisect_onnx
from reference_archive import floor
archive, onnx_path = workdir / f"{name}.npz", workdir / f"{name}.onnx"
bisect_onnx.check(archive)
checks, floors = [], []
for _ in range(reps):
    start = time.perf_counter()
    bisect_onnx.check(archive)
    checks.append(time.perf_counter() - start)
    floors.append(floor(archive, onnx_path, in_place=True))
print(json.dumps({"check": checks, "floor": floors}))
'''


def main() -> None:
    """Each model, each round, each checkout in turn: one line of figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, type=Path, help="the two checkouts, before and after")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--models", default="bert_base,resnet50")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for name in args.models.split(","):
        for round_number in range(1, args.rounds + 1):
            for tree in args.trees:
                done = subprocess.run(
                    [sys.executable, "-c", _ONE_PROCESS, str(tree.resolve()),
                     str(args.workdir), name, str(args.reps)],
                    capture_output=True, text=True, check=False)
                if done.returncode:
                    raise SystemExit(f"{tree}: {done.stderr.strip()[-2000:]}")
                times = json.loads(done.stdout.strip().splitlines()[-1])
                check, floor = times["check"], times["floor"]
                print(f"{name} round {round_number} {tree}: check {min(check):.2f} / "
                      f"{statistics.median(check):.2f} s, floor in place {min(floor):.2f} / "
                      f"{statistics.median(floor):.2f} s, {min(check) / min(floor):.2f}x "
                      f"(best), load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
