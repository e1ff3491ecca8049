"""The public face: what ``bisect_onnx`` exports, and what importing it costs."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import bisect_onnx
from fixtures.registry import REPO_ROOT


def test_public_names_are_exactly_these():
    assert sorted(bisect_onnx.__all__) == sorted([
        "bisect", "bisect_onnx_models", "bisect_decode", "DecodeOptions", "DecodeReport",
        "Samples", "RandomInputs", "Tolerance",
        "ExportOptions", "RuntimeOptions", "SearchOptions", "OutputOptions",
        "FixOptions",
        "DEFAULT_RTOL", "DEFAULT_ATOL", "record", "check", "Reference",
        "Report", "Record", "Coverage", "assert_parity", "ParityError", "events",
        "BisectOnnxError", "UsageError", "InputError", "ModelError", "RuntimeRefused",
        "BisectOnnxWarning", "__version__",
    ])
    for name in bisect_onnx.__all__:
        assert hasattr(bisect_onnx, name), name


@pytest.mark.parametrize("module", ["bisect_onnx", "bisect_onnx.pytest_plugin"])
def test_importing_loads_neither_torch_nor_onnxruntime(module):
    # The pytest plugin loads in every pytest run where bisect-onnx is installed.
    code = (f"import sys, {module}; "
            "print(sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_user_errors_share_one_base_with_exit_codes():
    assert issubclass(bisect_onnx.InputError, bisect_onnx.BisectOnnxError)
    assert issubclass(bisect_onnx.UsageError, bisect_onnx.BisectOnnxError)
    assert bisect_onnx.InputError.exit_code == 2
    assert bisect_onnx.ModelError.exit_code == 3


def test_ci_runs_the_test_command_the_readme_gives():
    readme = (REPO_ROOT / "README.md").read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    test_lines = [line for line in readme.splitlines() if line.endswith("python -m pytest")]
    assert len(test_lines) == 1
    assert test_lines[0] in ci.splitlines()


def test_readme_options_table_lists_every_option():
    from bisect_onnx.cli.parser import build_parser

    readme = (REPO_ROOT / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `-")]
    listed = {option for row in rows for option in
              re.findall(r"--[a-z0-9-]+", row.split(" | ", 1)[0])}
    options = {option for action in build_parser()._actions
               for option in action.option_strings if option.startswith("--")}
    assert options - listed == set(), "options the README's table does not list"


def test_readme_sample_output_is_what_the_example_prints(capsys, monkeypatch):
    from bisect_onnx.cli.command import main

    readme = (REPO_ROOT / "README.md").read_text()
    sample = readme.split("The output of the example above, unedited:\n\n```\n", 1)[1]
    sample = sample.split("```", 1)[0]
    command = next(line for line in readme.splitlines() if "bisect-onnx fixtures/" in line)
    args = command.split("&& bisect-onnx ", 1)[1].split()
    monkeypatch.chdir(REPO_ROOT)
    main(args)
    assert capsys.readouterr().out == sample


def test_readme_api_example_runs_outside_the_repository(tmp_path):
    # Only the package is importable (no fixtures/, no tests/): what a user has.
    readme = (REPO_ROOT / "README.md").read_text()
    example = readme.split("## Python API\n\n```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.py").write_text(example)
    site = tmp_path / "site"
    site.mkdir()
    (site / "bisect_onnx").symlink_to(REPO_ROOT / "bisect_onnx")
    result = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, text=True,
                            capture_output=True, env={**os.environ, "PYTHONPATH": str(site)},
                            timeout=600)
    assert result.returncode == 0, result.stderr
    assert "DIVERGED: culprit ONNX node 'node_avg_pool2d'" in result.stdout
    assert "example.py:" in result.stdout  # the source line is the user's own file
