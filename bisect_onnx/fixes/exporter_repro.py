"""A standalone torch script that exports the culprit op alone and shows the mismatch.

Where no other export reaches parity, the bug is the exporter's to fix: the script is
what its issue tracker asks for (torch, onnxruntime, a dozen lines of model). It
builds a module that calls the culprit's ATen op with the traced arguments, exports it
with the exporter and settings the failing file was made with, runs it in ONNX
Runtime and compares with PyTorch at the run's tolerance. It exits 1 while the export
disagrees (``MISMATCH``), 0 once it agrees, 2 when the export or ONNX Runtime fails.
:func:`check_repro_script` runs it in a subprocess, so that only a script seen to
print the mismatch is said to reproduce it.
"""

from __future__ import annotations

import string
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bisect_onnx.fixes.exporter_op import CulpritOp
from bisect_onnx.pytorch.reexport import ExportCall

__all__ = ["ReproCheck", "exporter_repro_script", "check_repro_script"]

#: Exit status of a script that shows the mismatch.
MISMATCH_STATUS = 1


@dataclass(frozen=True)
class ReproCheck:
    """What running the script printed, and whether it showed the mismatch."""

    reproduces: bool
    returncode: int | None
    """``None`` where it ran past its time limit."""
    output: str


def exporter_repro_script(op: CulpritOp, used: ExportCall, *, rtol: float, atol: float,
                          culprit: str = "") -> str:
    """The script's text: the op alone, exported as ``used`` says, checked in ORT."""
    exporter = used.exporter or "dynamo"
    keywords = ExportCall(exporter, used.opset, {
        name: value for name, value in used.options.items()
        if name in ("optimize", "do_constant_folding")}).describe()
    names = ", ".join(spec.name for spec in op.inputs)
    makers = "\n".join(f"        {_maker(spec)}," for spec in op.inputs)
    where = f" at {culprit}" if culprit else ""
    module = f" (module {op.module!r})" if op.module else ""
    return _SCRIPT.substitute(
        target=op.target, exporter=exporter, keywords=keywords, where=where, module=module,
        names=names, call=op.call, makers=makers, rtol=repr(float(rtol)),
        atol=repr(float(atol)))


def _maker(spec) -> str:
    """The source that makes one input: seeded normals for floats, zeros for indices."""
    dtype = f"torch.{spec.dtype}"
    if spec.dtype.startswith(("float", "bfloat", "complex")):
        return f"torch.randn({list(spec.shape)}, generator=generator).to({dtype})"
    if spec.dtype == "bool":
        return f"torch.ones({list(spec.shape)}, dtype=torch.bool)"
    return f"torch.zeros({list(spec.shape)}, dtype={dtype})"


def check_repro_script(text: str, *, timeout_s: float = 120.0) -> ReproCheck:
    """Run the script in a fresh Python, in a temporary folder: whether it shows the mismatch."""
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-exporter-repro-") as folder:
        path = Path(folder) / "exporter_repro.py"
        path.write_text(text)
        try:
            done = subprocess.run([sys.executable, str(path)], cwd=folder, capture_output=True,
                                  text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as error:
            return ReproCheck(False, None, f"ran past {timeout_s:g}s: {error.output or ''}")
    output = done.stdout + done.stderr
    shows = done.returncode == MISMATCH_STATUS and "MISMATCH" in done.stdout
    return ReproCheck(shows, done.returncode, output)


_SCRIPT = string.Template('''\
"""$target exported alone by the $exporter exporter disagrees with PyTorch in ONNX Runtime.

Found by bisect-onnx$where$module. Run: python exporter_repro.py
Exits 1 while the export disagrees with PyTorch (MISMATCH), 0 once it agrees, 2 when
the export or ONNX Runtime fails. Needs torch, onnxscript and onnxruntime.
"""

import os
import sys
import tempfile

import numpy as np
import onnxruntime as ort
import torch

RTOL = $rtol
ATOL = $atol


class CulpritOp(torch.nn.Module):
    def forward(self, $names):
        return $call


def sample_inputs():
    generator = torch.Generator().manual_seed(0)
    return (
$makers
    )


def flat(output):
    if isinstance(output, torch.Tensor):
        return [output.detach().numpy()]
    return [array for each in output for array in flat(each)]


def main():
    model = CulpritOp().eval()
    inputs = sample_inputs()
    with torch.no_grad():
        expected = flat(model(*inputs))
    try:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "op.onnx")
            torch.onnx.export(model, inputs, path, $keywords)
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            names = [each.name for each in session.get_inputs()]
            actual = session.run(None, {name: value.numpy() for name, value in zip(names, inputs)})
    except Exception as error:
        print(f"the export or ONNX Runtime failed: {type(error).__name__}: {error}")
        return 2
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__} (CPU); "
          f"torch.onnx.export(..., $keywords); rtol={RTOL}, atol={ATOL}")
    failing = 0
    for index, (want, got) in enumerate(zip(expected, actual)):
        got = np.asarray(got)
        if want.shape != got.shape:
            print(f"output {index}: shape {list(got.shape)}, PyTorch's {list(want.shape)}")
            failing += 1
            continue
        want64, got64 = want.astype(np.float64), got.astype(np.float64)
        close = np.isclose(got64, want64, rtol=RTOL, atol=ATOL, equal_nan=True)
        worst = float(np.nanmax(np.abs(got64 - want64), initial=0.0))
        print(f"output {index}: max abs error {worst:.6g}, "
              f"{int((~close).sum())} of {close.size} elements out of tolerance")
        if not close.all():
            at = np.unravel_index(int(np.argmax(np.where(close, -1.0, np.abs(got64 - want64)))),
                                  close.shape)
            print(f"  at {[int(i) for i in at]}: PyTorch {want[at]}, ONNX Runtime {got[at]}")
            failing += 1
    if failing:
        print("MISMATCH: the export computes something else than $target")
        return 1
    print("OK: the export agrees with PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
''')
