"""pytest plugin: an ``onnx_parity`` fixture whose failures say where parity broke.

Registered through the ``pytest11`` entry point, so it loads in every pytest run of
an environment where bisect-onnx is installed: it must stay cheap, which is why it
imports neither torch nor onnxruntime (nor the rest of bisect-onnx) until a test
actually checks parity.

Options (one group, ``--bisect-onnx-`` prefix):

- ``--bisect-onnx-artifacts DIR``: each failing check writes its report (JSON, HTML)
  and the repro of its first divergence there (checked when the session starts: a
  file, or a place that cannot be written, is a usage error then, not a failure
  hidden behind the parity failure at the end);
- ``--bisect-onnx-rtol`` / ``--bisect-onnx-atol``: default tolerances of the fixture.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # for annotations only: the plugin imports neither at run time
    import onnx
    import torch
    from torch.export import ExportedProgram

_FAILURES = pytest.StashKey[list]()
_SECTION = "bisect-onnx"
_ARTIFACTS = "--bisect-onnx-artifacts"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the plugin's options."""
    group = parser.getgroup("bisect-onnx", "ONNX parity checks (bisect-onnx)")
    group.addoption("--bisect-onnx-artifacts", metavar="DIR", default=None,
                    help="write the report (JSON, HTML) and repro of every failing parity "
                    "check into DIR")
    group.addoption("--bisect-onnx-rtol", type=float, default=None, metavar="RTOL",
                    help="relative tolerance of onnx_parity checks (default 1e-3)")
    group.addoption("--bisect-onnx-atol", type=float, default=None, metavar="ATOL",
                    help="absolute tolerance of onnx_parity checks (default 1e-5)")


def pytest_configure(config: pytest.Config) -> None:
    """Check the artifact folder, and start the run's list of failed parity checks."""
    artifacts = config.getoption("bisect_onnx_artifacts", None)
    if artifacts is not None:
        from bisect_onnx.errors import BisectOnnxError
        from bisect_onnx.sources.output_paths import check_outputs

        try:
            check_outputs({_ARTIFACTS: artifacts}, folders={_ARTIFACTS})
        except BisectOnnxError as error:
            raise pytest.UsageError(str(error)) from error
    config.stash[_FAILURES] = []


@pytest.fixture
def onnx_parity(request: pytest.FixtureRequest):
    """``onnx_parity(model, inputs, onnx_model=None, **options)``: assert ONNX parity.

    The options are those of :func:`bisect_onnx.assert_parity`; the command-line
    tolerances and artifact folder are the defaults.
    """
    config = request.config

    def check(model: torch.nn.Module | ExportedProgram | torch.onnx.ONNXProgram | str | Path,
              inputs: object,
              onnx_model: str | Path | onnx.ModelProto | torch.onnx.ONNXProgram | None = None,
              **options: Any) -> None:  # assert_parity's keywords, passed on
        __tracebackhide__ = True  # pytest shows the test's line, not ours
        from dataclasses import replace

        from bisect_onnx.errors import ParityError
        from bisect_onnx.pipeline.options import OutputOptions, Tolerance
        from bisect_onnx.pipeline.parity import assert_parity

        # The test's own settings win, field by field, over the command line's.
        tolerance = Tolerance.of(options.get("tolerance"))
        rtol, atol = (config.getoption(f"bisect_onnx_{name}") for name in ("rtol", "atol"))
        options["tolerance"] = replace(
            tolerance, rtol=rtol if tolerance.rtol is None else tolerance.rtol,
            atol=atol if tolerance.atol is None else tolerance.atol)
        output = options.get("output") or OutputOptions()
        artifacts = config.getoption("bisect_onnx_artifacts")
        options["output"] = replace(
            output, label=output.label or request.node.nodeid,
            repro_dir=output.repro_dir or (Path(artifacts) if artifacts is not None else None))
        try:
            assert_parity(model, inputs, onnx_model, **options)
        except ParityError as error:
            config.stash[_FAILURES].append(  # its headline: one line per failing check
                (request.node.nodeid, error.report.summary().splitlines()[0]))
            raise

    return check


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Attach the verdict of a failed parity check to the test's report."""
    outcome = yield
    report = outcome.get_result()
    error = call.excinfo.value if call.excinfo is not None else None
    summary = getattr(getattr(error, "report", None), "summary", None)
    if callable(summary):
        report.sections.append((_SECTION, summary()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int,
                            config: pytest.Config) -> None:
    """One line per failed parity check, after the run."""
    failures = config.stash.get(_FAILURES, [])
    if not failures:
        return
    terminalreporter.section("bisect-onnx: where ONNX parity broke")
    for nodeid, summary in failures:
        terminalreporter.line(f"{nodeid}: {summary}")

