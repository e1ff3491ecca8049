"""The text of a repro folder: its ``README.txt`` and the ``repro.py`` it runs alone.

The script needs nothing but numpy and onnxruntime, so it restates the comparison rule
of :func:`bisect_onnx.judge.compare.compare_arrays`; tests/report/test_repro.py holds
the two equal.
"""

from __future__ import annotations

import string

__all__ = ["readme_text", "repro_script"]


def readme_text(*, value: str, nodes: int, reference: str, reproduces: bool) -> str:
    """``README.txt``: what the folder holds and how to run it."""
    return _README.format(value=value, nodes=nodes, reference=reference,
                          verdict="reproduces" if reproduces else "does NOT reproduce")


def repro_script(*, output: str, rtol: float, atol: float, opt_level: str,
                 reference: str) -> str:
    """``repro.py``: exits 1 while ONNX Runtime's value of ``output`` still disagrees.

    ``opt_level`` is the name of ONNX Runtime's ``GraphOptimizationLevel`` member
    (``ORT_ENABLE_ALL``); ``reference`` names the side the expected value comes from.
    """
    return _SCRIPT.substitute(output=repr(output), rtol=repr(float(rtol)),
                              atol=repr(float(atol)), opt_level=repr(opt_level),
                              reference=reference)


_README = """\
A repro made by bisect-onnx: ONNX Runtime disagrees with {reference} on the value {value!r}.
model.onnx holds only the {nodes} node(s) that compute it, fed the values in inputs.npz
({reference}'s values, the model's inputs, or ONNX Runtime's where the segment was cut;
see environment.json). expected.npz is {reference}'s value, candidate.npz ONNX Runtime's in
the full model. When it was written, the segment alone {verdict} the mismatch.
Run:  python repro.py   (needs numpy and onnxruntime; exits 1 while the mismatch
reproduces, 0 once fixed). backend_test/ is the same case in the ONNX backend-test
layout, ready to attach to an issue upstream.
"""

_SCRIPT = string.Template('''\
"""Re-run the ONNX Runtime divergence bisect-onnx found, on the smallest failing segment.

Exits 1 while ONNX Runtime's value differs from $reference's (expected.npz), 0 once it
agrees, 2 when the model cannot run. Needs only numpy and onnxruntime.
"""

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
OUTPUT = $output
RTOL = $rtol
ATOL = $atol
OPT_LEVEL = $opt_level  # the graph optimization level the divergence was found at
SHOWN = 5  # worst elements printed


def out_of_tolerance(expected, actual):
    """Where |actual - expected| > ATOL + RTOL * |expected|; equal NaN/Inf agree."""
    if not np.issubdtype(expected.dtype, np.inexact):
        return expected != actual  # integers and booleans: exact
    kind = np.complex128 if np.iscomplexobj(expected) else np.float64
    ref, got = expected.astype(kind), actual.astype(kind)
    with np.errstate(all="ignore"):
        within = np.abs(got - ref) <= ATOL + RTOL * np.abs(ref)
    within &= np.isfinite(ref) & np.isfinite(got)
    same_nonfinite = (np.isnan(ref) & np.isnan(got)) | (~np.isfinite(ref) & (ref == got))
    return ~(within | same_nonfinite)


def main():
    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVEL)
        session = ort.InferenceSession(str(HERE / "model.onnx"), options,
                                       providers=["CPUExecutionProvider"])
        with np.load(HERE / "inputs.npz") as archive:
            feeds = {name: archive[name] for name in archive.files}
        actual = np.asarray(session.run([OUTPUT], feeds)[0])
    except Exception as error:
        print(f"model.onnx does not run in ONNX Runtime {ort.__version__}: {error}")
        return 2
    with np.load(HERE / "expected.npz") as archive:
        expected = archive[OUTPUT]
    print(f"ONNX Runtime {ort.__version__} (CPU, {OPT_LEVEL}), value {OUTPUT!r}, "
          f"rtol={RTOL}, atol={ATOL}")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        print(f"MISMATCH: got {actual.dtype}{list(actual.shape)}, "
              f"expected {expected.dtype}{list(expected.shape)}")
        return 1
    bad = out_of_tolerance(expected, actual)
    kind = np.complex128 if np.iscomplexobj(expected) else np.float64
    ref, got = expected.astype(kind), actual.astype(kind)
    finite = np.isfinite(ref) & np.isfinite(got)
    with np.errstate(all="ignore"):
        diff = np.where(finite, np.abs(got - ref), 0.0)
        rel = np.where(finite & (ref != 0), diff / np.abs(np.where(ref != 0, ref, 1)), 0.0)
    print(f"max abs error {diff.max(initial=0.0):.6g}, max rel error {rel.max(initial=0.0):.6g}, "
          f"{np.count_nonzero(bad)} of {bad.size} elements out of tolerance "
          f"({np.count_nonzero(bad) / max(bad.size, 1):.2%})")
    if not bad.any():
        print("OK: ONNX Runtime agrees with $reference")
        return 0
    worst = np.argsort(np.where(bad, np.where(finite, diff, np.inf), -1.0), axis=None)[::-1]
    for flat in worst[:min(SHOWN, np.count_nonzero(bad))]:
        index = np.unravel_index(flat, bad.shape)
        print(f"  at {list(map(int, index))}: expected {expected[index]}, got {actual[index]}")
    print("MISMATCH: ONNX Runtime still disagrees with $reference")
    return 1


if __name__ == "__main__":
    sys.exit(main())
''')
