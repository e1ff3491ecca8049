"""Several real input sets in one run, and per-value tolerances in the PyTorch form."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.errors import UsageError
from bisect_onnx.sources.input_samples import load_input_samples
from fixtures.registry import FIXTURES, REPO_ROOT

# The pool's error, and what it carries downstream, fit under these; nothing else does.
LOOSE = (0.5, 0.5)


def _other_input(inputs: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(array.shape).astype(array.dtype)
            for name, array in inputs.items()}


# several input sets -----------------------------------------------------------------------

def test_each_input_set_is_compared_and_the_worst_reported(fixture_case):
    model, inputs, exported = fixture_case("tiny_mlp")
    samples = bisect_onnx.Samples([inputs, _other_input(inputs, 1)], labels=["a.npz", "b.npz"])
    report = bisect_onnx.bisect(model, samples, onnx_model=exported)
    assert report.verdict == "parity"
    assert "worst of 2 input sets (0 diverged)" in report.note
    assert report.reference["inputs"].endswith("of 2)")


def test_an_export_made_on_the_first_set_runs_pytorch_again_on_the_others(fixture_case):
    # PyTorch's run on the first set is kept from the export; the second set's values
    # must be its own, or its comparison would pair two different inputs' values.
    model, inputs, _ = fixture_case("tiny_mlp")
    samples = bisect_onnx.Samples([inputs, _other_input(inputs, 2)])
    report = bisect_onnx.bisect(model, samples)
    assert report.verdict == "parity", report.summary()
    assert "worst of 2 input sets (0 diverged)" in report.note


def test_the_cli_takes_a_folder_of_npz_files_or_several_of_them(fixture_case, tmp_path,
                                                               monkeypatch):
    model, inputs, _ = fixture_case("tiny_mlp")
    folder = tmp_path / "sets"
    folder.mkdir()
    for seed in range(3):
        np.savez(folder / f"set{seed}.npz", **_other_input(inputs, seed))
    monkeypatch.chdir(REPO_ROOT)
    fixture = FIXTURES["tiny_mlp"]
    for given in ([str(folder)], [str(path) for path in sorted(folder.iterdir())[:2]]):
        report_path = tmp_path / "report.json"
        status = main([fixture.factory, *[arg for path in given for arg in ("--input", path)],
                       "--onnx", fixture.onnx_file, "-q", "--json", str(report_path)])
        assert status == 0
        note = json.loads(report_path.read_text())["note"]
        assert f"worst of {3 if len(given) == 1 else 2} input sets" in note


def test_a_folder_without_sample_files_or_mixed_with_files_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError, match="holds no .npz or .pt file"):
        load_input_samples([empty])
    (tmp_path / "one.npz").write_bytes(b"")
    with pytest.raises(UsageError, match="is a folder: pass it alone"):
        load_input_samples([empty, tmp_path / "one.npz"])


def test_onnx_against_onnx_takes_input_sets_too(fixture_case):
    _, inputs, exported = fixture_case("tiny_mlp")
    samples = bisect_onnx.Samples([inputs, _other_input(inputs, 3)])
    report = bisect_onnx.bisect_onnx_models(exported, inputs=samples,
                                            reference_runtime="onnx.reference")
    assert report.verdict == "parity"
    assert "worst of 2 input sets" in report.note


# per-value tolerances ----------------------------------------------------------------------

def test_a_rule_loosens_only_the_values_it_names(fixture_case):
    model, inputs, exported = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported,
                                tolerance=bisect_onnx.Tolerance(rules={"avg_pool2d": LOOSE}))
    assert report.diverged
    pool = next(row for row in report.comparisons if row.onnx_value == "avg_pool2d")
    assert pool.figures.status == "pass" and (pool.figures.rtol, pool.figures.atol) == LOOSE
    # The pool's error still reaches the values after it, which keep the base tolerance.
    assert report.first_divergence.onnx_value != "avg_pool2d"
    assert report.first_divergence.figures.atol is None


def test_rules_by_op_and_module_name_can_make_parity(fixture_case):
    model, inputs, exported = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported,
                                tolerance=bisect_onnx.Tolerance(rules={
                                    "avg_pool2d": LOOSE, "view": LOOSE, "node_linear": LOOSE,
                                    "linear": LOOSE, "never_*": (1.0, 1.0)}))
    assert report.verdict == "parity", report.summary()
    codes = [getattr(warning, "code", None) for warning in report.warnings]
    assert "unused-tolerance-rule" in codes
    assert any("never_*" in warning for warning in report.warnings)


def test_the_cli_reads_a_tolerance_file_for_a_pytorch_model(tmp_path, monkeypatch, capsys):
    fixture = FIXTURES["avgpool_divisor"]
    rules = tmp_path / "tolerances.txt"
    rules.write_text("# loosen everything the pool's error reaches\n* 0.5 0.5\n")
    monkeypatch.chdir(REPO_ROOT)
    status = main([fixture.factory, "--input", fixture.input_file, "--onnx", fixture.onnx_file,
                   "--tolerances", str(rules), "-q"])
    assert status == 0, capsys.readouterr().err
    status = main([fixture.factory, "--input", fixture.input_file, "--onnx", fixture.onnx_file,
                   "-q"])
    assert status == 1


def test_random_inputs_over_max_memory_are_refused_before_they_are_made(fixture_case):
    model, _, exported = fixture_case("tiny_mlp")  # 2 x 16 float32: 128 bytes a sample
    with pytest.raises(bisect_onnx.BisectOnnxError, match=r"--max-memory"):
        bisect_onnx.bisect(model, onnx_model=exported,
                           runtime=bisect_onnx.RuntimeOptions(max_memory=64))


def test_a_rule_on_a_module_name_applies_to_the_op_rows_inside_it(fixture_case):
    model, inputs, exported = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported,
                                tolerance=bisect_onnx.Tolerance(rules={"pool": LOOSE}))
    assert report.coverage.granularity == "op"
    pool = next(row for row in report.comparisons if row.torch_module == "pool")
    assert pool.figures.status == "pass" and (pool.figures.rtol, pool.figures.atol) == LOOSE
    assert not any(getattr(w, "code", None) == "unused-tolerance-rule"
                   for w in report.warnings)


def test_the_onnx_form_cli_takes_a_folder_of_input_sets(fixture_case, tmp_path, monkeypatch):
    _, inputs, exported = fixture_case("tiny_mlp")
    folder = tmp_path / "sets"
    folder.mkdir()
    for seed in range(2):
        np.savez(folder / f"set{seed}.npz", **_other_input(inputs, seed))
    report_path = tmp_path / "report.json"
    status = main([str(exported), "--against-reference-evaluator", "--input", str(folder),
                   "-q", "--json", str(report_path)])
    assert status == 0
    assert "worst of 2 input sets" in json.loads(report_path.read_text())["note"]


def test_values_over_the_budget_are_said_to_be_unprobed_not_fused(fixture_case):
    model, inputs, exported = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported,
                                runtime=bisect_onnx.RuntimeOptions(max_memory=1))
    assert report.search.mode == "bisection"
    kinds = {item.kind for item in report.unaligned}
    assert "runtime-fused" not in kinds
