"""The options objects: built from the command line as by hand, checked once for both."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.cli.parser import build_parser

PUBLIC_FUNCTIONS = (bisect_onnx.bisect, bisect_onnx.bisect_onnx_models,
                    bisect_onnx.assert_parity)


def parsed(*argv: str):
    return build_parser().parse_args(["model.onnx", *argv])


@pytest.mark.parametrize(("argv", "built"), [
    ([], bisect_onnx.Tolerance()),
    (["--rtol", "0.01", "--atol", "0", "--tolerances", "rules.txt"],
     bisect_onnx.Tolerance(rtol=0.01, atol=0.0, rules=Path("rules.txt"))),
    ([], bisect_onnx.ExportOptions()),
    (["--exporter", "torchscript", "--opset", "17", "--dynamic", "--save-onnx", "out.onnx"],
     bisect_onnx.ExportOptions(exporter="torchscript", opset=17, dynamic_batch=True,
                               save_to=Path("out.onnx"))),
    ([], bisect_onnx.RuntimeOptions()),
    (["--opt-level", "basic", "--promote", "all", "--max-memory", "2GiB"],
     bisect_onnx.RuntimeOptions(opt_level="basic", promote="all", max_memory="2GiB")),
    ([], bisect_onnx.RandomInputs()),
    (["--seed", "3", "--dim", "batch=2", "--dim", "seq=16", "--samples", "4"],
     bisect_onnx.RandomInputs(seed=3, dims={"batch": 2, "seq": 16}, samples=4)),
    ([], bisect_onnx.SearchOptions()),
    (["--granularity", "module", "--all-culprits"],
     bisect_onnx.SearchOptions(granularity="module", all_culprits=True)),
    ([], bisect_onnx.OutputOptions(label="model.onnx")),
    (["--repro-dir", "repro"], bisect_onnx.OutputOptions(repro_dir=Path("repro"),
                                                         label="model.onnx")),
])
def test_each_options_object_is_built_from_its_own_arguments(argv, built):
    assert type(built).from_args(parsed(*argv)) == built


def test_export_options_are_none_beside_onnx_and_refused_with_it():
    assert bisect_onnx.ExportOptions.from_args(parsed("--onnx", "m.onnx")) is None
    with pytest.raises(bisect_onnx.UsageError, match="--opset, --dynamic apply to an export"):
        bisect_onnx.ExportOptions.from_args(parsed("--onnx", "m.onnx", "--opset", "17",
                                                   "--dynamic"))
    with pytest.raises(bisect_onnx.UsageError,
                       match="--save-onnx applies to an export made here; drop it with --onnx"):
        bisect_onnx.ExportOptions.from_args(parsed("--onnx", "m.onnx", "--save-onnx", "c.onnx"))


def test_random_input_settings_beside_given_inputs_are_refused():
    assert bisect_onnx.RandomInputs.from_args(parsed("--input", "x.npy")) == (
        bisect_onnx.RandomInputs())
    with pytest.raises(bisect_onnx.UsageError, match="apply to random inputs"):
        bisect_onnx.RandomInputs.from_args(parsed("--input", "x.npy", "--seed", "1"))


@pytest.mark.parametrize(("argv", "make"), [
    (["--rtol", "-1"], lambda: bisect_onnx.Tolerance(rtol=-1.0)),
    (["--atol", "nan"], lambda: bisect_onnx.Tolerance(atol=float("nan"))),
    (["--max-memory", "lots"], lambda: bisect_onnx.RuntimeOptions(max_memory="lots")),
    (["--provider", "NoSuchProvider"],
     lambda: bisect_onnx.RuntimeOptions(provider="NoSuchProvider")),
    (["--samples", "0"], lambda: bisect_onnx.RandomInputs(samples=0)),
    (["--samples", "20000"], lambda: bisect_onnx.RandomInputs(samples=20000)),
])
def test_a_bad_value_is_the_same_one_line_error_from_the_cli_and_the_api(argv, make, capsys,
                                                                         tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing to read: the value is refused before any file
    with pytest.raises(bisect_onnx.UsageError) as raised:
        make()
    assert main(["fixtures/models.py:tiny_mlp", *argv]) == 2
    assert capsys.readouterr().err == f"bisect-onnx: error: {raised.value}\n"


def test_an_unknown_granularity_is_a_usage_error_naming_the_choices():
    with pytest.raises(bisect_onnx.UsageError, match="'layer'; choose one of op, module"):
        bisect_onnx.SearchOptions(granularity="layer")


@pytest.mark.parametrize("tolerance", [(1e-3,), "1e-3", 1e-3])
def test_a_tolerance_that_is_neither_a_pair_nor_a_tolerance_is_refused(tolerance):
    with pytest.raises(bisect_onnx.UsageError, match=r"an \(rtol, atol\) pair"):
        bisect_onnx.Tolerance.of(tolerance)


def test_a_tolerance_is_given_as_a_pair_or_an_object_alike():
    assert bisect_onnx.Tolerance.of((0.1, 0.2)) == bisect_onnx.Tolerance(rtol=0.1, atol=0.2)
    judge = bisect_onnx.Tolerance(rules={"relu_*": (0.5, 0.25)}).judge()
    assert (judge.base.rtol, judge.base.atol) == (bisect_onnx.DEFAULT_RTOL,
                                                  bisect_onnx.DEFAULT_ATOL)
    assert judge.tolerance("relu_1").atol == 0.25


def test_a_bad_per_value_rule_is_refused_when_the_tolerance_is_made():
    with pytest.raises(bisect_onnx.UsageError, match="rtol must be a finite number"):
        bisect_onnx.Tolerance(rules={"relu_*": (-1.0, 0.0)})


@pytest.mark.parametrize("function", PUBLIC_FUNCTIONS, ids=lambda f: f.__name__)
def test_public_functions_take_at_most_nine_parameters(function):
    # Eight, and suggest_fix (issue 33) until it joins an option object.
    assert len(inspect.signature(function).parameters) <= 9


def test_public_functions_name_the_same_things_the_same_way():
    names = [set(inspect.signature(function).parameters) for function in PUBLIC_FUNCTIONS]
    shared = {"inputs", "tolerance", "output"}
    assert all(shared <= parameters for parameters in names)
    bisect_only, models, parity = names
    assert {"onnx_model", "export"} <= bisect_only & parity
    assert {"search"} <= bisect_only & models
    # Every option a function takes is one of these: no second name for one thing.
    known = {"model", "reference", "candidate", "inputs", "onnx_model", "tolerance", "export",
             "runtime", "reference_runtime", "candidate_runtime", "search", "output",
             "suggest_fix"}
    assert set().union(*names) <= known


@pytest.mark.parametrize("option", [["--seed", "0"], ["--samples", "1"], ["--seed", "3"]])
def test_a_random_input_setting_given_beside_inputs_is_refused_at_its_default_too(option):
    # Given, a default value is still a setting the given inputs would silently ignore.
    with pytest.raises(bisect_onnx.UsageError, match=f"drop {option[0]}, or drop the given"):
        bisect_onnx.RandomInputs.from_args(parsed("--input", "x.npy", *option))
    assert bisect_onnx.RandomInputs.from_args(parsed(*option)) == bisect_onnx.RandomInputs(
        **{option[0].removeprefix("--"): int(option[1])})
