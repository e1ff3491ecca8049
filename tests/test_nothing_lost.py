"""Nothing lost, nothing allocated blindly (issue 20): a test per row of the issue's table.

Each row is a hostile or careless command line: an output path that is one of the
run's inputs (directly, through a symlink or a hard link), two outputs on one path,
a factory that exits, sizes that cannot fit, empty and non-regular files, vacuous
parity. The user's files are hashed before and after: a refusal must leave them as
they were.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.errors import InputError, ModelError, UsageError
from bisect_onnx.sources.input_sizes import MAX_SAMPLES
from bisect_onnx.sources.loading import load_input_files
from fixtures.registry import REPO_ROOT

pytest_plugins = ["pytester"]


def digest(*paths: Path) -> dict[str, str]:
    """Content hashes of the user's files, to compare before and after a run."""
    return {str(path): hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in paths}


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bisect-onnx: error: "), err
    assert "Traceback" not in err
    return lines[0]


def scale_model(factor: float = 2.0, shape=(2, 3)) -> onnx.ModelProto:
    """``y = x * factor``: an ONNX model that runs in milliseconds."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], ["y"], name="scale")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializer=[numpy_helper.from_array(np.float32(factor), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """A user's folder: a factory, its input, an ONNX file; the run starts there."""
    (tmp_path / "model.py").write_text(
        "import torch\n"
        "class Scale(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 2\n"
        "def make():\n"
        "    return Scale()\n")
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    onnx.save(scale_model(), str(tmp_path / "m.onnx"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_refused(capsys, argv, files) -> str:
    """Run the command, expect exit status 2 in one line, and the files untouched."""
    before = digest(*files)
    status = main(argv)
    line = one_line_error(capsys)
    assert status == 2, line
    assert digest(*files) == before
    return line


# --- outputs that are inputs -------------------------------------------------------------

def test_json_onto_the_input_is_refused(user_files, capsys):
    line = run_refused(capsys, ["model.py:make", "--input", "x.npy", "--json", "x.npy"],
                       [user_files / "x.npy"])
    assert "--json x.npy is --input x.npy" in line


def test_html_onto_the_onnx_file_is_refused(user_files, capsys):
    line = run_refused(capsys, ["model.py:make", "--input", "x.npy", "--onnx", "m.onnx",
                                "--html", "m.onnx"], [user_files / "m.onnx"])
    assert "--html m.onnx is --onnx m.onnx" in line


def test_json_onto_the_reference_in_onnx_against_onnx_is_refused(user_files, capsys):
    onnx.save(scale_model(2.0), "ref.onnx")
    line = run_refused(capsys, ["ref.onnx", "--against", "m.onnx", "--json", "ref.onnx"],
                       [user_files / "ref.onnx", user_files / "m.onnx"])
    assert "--json ref.onnx is MODEL ref.onnx" in line


@pytest.mark.parametrize("option", ["--model-explorer", "--save-onnx"])
def test_output_onto_the_factory_source_is_refused(user_files, capsys, option):
    line = run_refused(capsys, ["model.py:make", "--input", "x.npy", option, "model.py"],
                       [user_files / "model.py"])
    assert f"{option} model.py is MODEL's source model.py" in line


def test_output_onto_a_dotted_factory_module_is_refused(user_files, capsys):
    line = run_refused(capsys, ["model:make", "--input", "x.npy", "--save-onnx", "model.py"],
                       [user_files / "model.py"])
    assert "MODEL's source" in line


def test_json_through_a_symlink_onto_the_input_is_refused(user_files, capsys):
    os.symlink(user_files / "x.npy", user_files / "link.json")
    line = run_refused(capsys, ["model.py:make", "--input", "x.npy", "--json", "link.json"],
                       [user_files / "x.npy"])
    assert "--json link.json is --input x.npy" in line


def test_json_onto_a_hard_link_of_the_input_is_refused(user_files, capsys):
    os.link(user_files / "x.npy", user_files / "hard.json")
    line = run_refused(capsys, ["model.py:make", "--input", "x.npy", "--json", "hard.json"],
                       [user_files / "x.npy"])
    assert "is --input x.npy" in line


def test_repro_folder_holding_an_input_is_refused(user_files, capsys):
    line = run_refused(capsys, ["model.py:make", "--input", "x.npy", "--onnx", "m.onnx",
                                "--repro-dir", "."], [user_files / "m.onnx"])
    assert "--repro-dir . holds" in line and "new or empty folder" in line


def test_output_onto_external_data_is_refused(user_files, capsys):
    model = scale_model()
    onnx.save(model, "big.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="big.data", size_threshold=0)
    line = run_refused(capsys, ["big.onnx", "--against-reference-evaluator",
                                "--json", "big.data"],
                       [user_files / "big.onnx", user_files / "big.data"])
    assert "external data of MODEL" in line


def test_output_onto_the_tolerance_file_is_refused(user_files, capsys):
    Path("tolerances.txt").write_text("* 1e-3 1e-5\n")
    line = run_refused(capsys, ["m.onnx", "--against-reference-evaluator", "--tolerances",
                                "tolerances.txt", "--html", "tolerances.txt"],
                       [user_files / "tolerances.txt"])
    assert "is --tolerances tolerances.txt" in line


def test_two_outputs_on_one_path_are_refused(user_files, capsys):
    line = run_refused(capsys, ["model.py:make", "--input", "x.npy", "--json", "same.out",
                                "--html", "same.out"], [user_files / "x.npy"])
    assert "are the same file" in line
    assert not (user_files / "same.out").exists()


# --- the API makes the same checks -------------------------------------------------------

def test_api_refuses_what_the_cli_refuses(user_files):
    x = np.ones((2, 3), np.float32)
    before = digest(user_files / "m.onnx", user_files / "x.npy")
    with pytest.raises(UsageError, match="repro_dir"):
        bisect_onnx.bisect_onnx_models("m.onnx", inputs=x, reference_runtime="onnx.reference",
                                       output=bisect_onnx.OutputOptions(repro_dir="."))
    with pytest.raises(UsageError, match=r"repro_dir .* holds onnx_model \(m\.onnx\)"):
        bisect_onnx.bisect(np.zeros(1), x, onnx_model="m.onnx",
                           output=bisect_onnx.OutputOptions(repro_dir=user_files))
    with pytest.raises(UsageError, match="output.repro_dir"):
        bisect_onnx.assert_parity("m.onnx", x, "m.onnx",
                                  output=bisect_onnx.OutputOptions(repro_dir=user_files))
    assert digest(user_files / "m.onnx", user_files / "x.npy") == before


def test_api_refuses_a_save_to_over_the_class_source(user_files):
    sys.path.insert(0, str(user_files))
    try:
        import model as user_model
    finally:
        sys.path.remove(str(user_files))
    before = digest(user_files / "model.py")
    with pytest.raises(UsageError, match="the source of Scale"):
        bisect_onnx.bisect(user_model.make(), np.ones((2, 3), np.float32),
                           export=bisect_onnx.ExportOptions(save_to=user_files / "model.py"))
    assert digest(user_files / "model.py") == before


def test_report_writers_refuse_the_compared_model(user_files):
    report = bisect_onnx.bisect_onnx_models("m.onnx", inputs=np.ones((2, 3), np.float32),
                                            reference_runtime="onnx.reference")
    before = digest(user_files / "m.onnx")
    from bisect_onnx.report.html import write_html
    from bisect_onnx.report.json import write_json

    for write in (write_json, write_html):
        with pytest.raises(UsageError, match="the compared model"):
            write(report, user_files / "m.onnx")
    assert digest(user_files / "m.onnx") == before


# --- a factory that exits ----------------------------------------------------------------

def test_factory_calling_sys_exit_is_a_model_error(user_files, capsys):
    Path("exits.py").write_text("import sys\ndef make():\n    sys.exit(0)\n")
    status = main(["exits.py:make", "--input", "x.npy", "--onnx", "m.onnx"])
    line = one_line_error(capsys)
    assert status == 3
    assert "exits.py:make() called sys.exit(0)" in line


def test_module_calling_sys_exit_on_import_is_a_model_error(user_files, capsys):
    Path("script.py").write_text("import sys\nsys.exit(0)\ndef make():\n    pass\n")
    assert main(["script.py:make", "--input", "x.npy"]) == 3
    assert "importing script.py called sys.exit(0)" in one_line_error(capsys)


def test_forward_calling_sys_exit_is_a_model_error(user_files):
    import torch

    class Exits(torch.nn.Module):
        def forward(self, x):
            sys.exit(0)

    with pytest.raises(ModelError, match=r"Exits\.forward .*sys\.exit\(0\)"):
        bisect_onnx.bisect(Exits(), np.ones((2, 3), np.float32))
    with pytest.raises(ModelError, match="sys.exit"):
        bisect_onnx.assert_parity(Exits(), np.ones((2, 3), np.float32), "m.onnx")


def test_factory_returning_a_number_says_what_it_returned(user_files, capsys):
    Path("answer.py").write_text("def make():\n    return 42\n")
    assert main(["answer.py:make", "--input", "x.npy"]) == 2
    line = one_line_error(capsys)
    assert "returned 42 (of type int)" in line and "a int" not in line


# --- names and places that cannot be written ---------------------------------------------

def test_a_300_character_output_name_is_one_line(user_files, capsys):
    line = run_refused(capsys, ["model.py:make", "--input", "x.npy", "--json",
                                "r" * 300 + ".json"], [user_files / "x.npy"])
    assert "bytes long" in line and "shorter name" in line


@pytest.mark.parametrize("option", ["--html", "--repro-dir"])
def test_an_unwritable_place_is_refused_before_the_run(user_files, capsys, option):
    target = "/sys/bisect-onnx-report"  # refused even to root
    if not Path("/sys").is_dir():
        pytest.skip("needs /sys, a folder even root cannot create files in")
    seen = []
    with bisect_onnx.events.listening(seen.append):
        line = run_refused(capsys, ["model.py:make", "--input", "x.npy", option, target],
                           [user_files / "x.npy"])
    assert "cannot write in /sys" in line
    assert not seen  # nothing ran


def test_plugin_artifacts_naming_a_file_is_a_usage_error(pytester):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    blocker = pytester.path / "artifacts"
    blocker.write_text("a file, not a folder")
    result = pytester.runpytest_subprocess("--bisect-onnx-artifacts", str(blocker),
                                           "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "is a file; name a folder" in result.stderr.str()
    assert "FileExistsError" not in result.stdout.str() + result.stderr.str()


# --- sizes known before memory is taken ---------------------------------------------------

def inflating_npz(path: Path, size: int) -> None:
    """An .npz whose one member is ``size`` bytes of zeros, compressed to almost nothing."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive, \
            archive.open("x.npy", "w", force_zip64=True) as member:
        header = {"descr": "<f4", "fortran_order": False, "shape": (size // 4,)}
        np.lib.format.write_array_header_1_0(member, header)
        chunk = bytes(1 << 20)
        for _ in range(size // len(chunk)):
            member.write(chunk)


def test_inflating_npz_is_refused_from_its_header(tmp_path):
    path = tmp_path / "bomb.npz"
    inflating_npz(path, 64 << 20)
    assert path.stat().st_size < (1 << 20)  # a small file that inflates 64-fold and more
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"64\.0 MiB, over the memory budget of "
                                             r"16\.0 MiB \(--max-memory\)"):
            load_input_files([path], max_memory="16MiB")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20  # the member was never inflated


def test_inflating_npz_at_the_cli(user_files, capsys):
    inflating_npz(user_files / "bomb.npz", 32 << 20)
    line = run_refused(capsys, ["model.py:make", "--input", "bomb.npz", "--max-memory", "8MB"],
                       [user_files / "bomb.npz"])
    assert "over the memory budget" in line and "32.0 MiB" in line


def test_a_huge_dim_is_refused_with_its_size(user_files, capsys):
    onnx.save(scale_model(shape=("s77", 1024)), "dyn.onnx")
    line = run_refused(capsys, ["dyn.onnx", "--against-reference-evaluator", "--dim",
                                "s77=1000000000"], [user_files / "dyn.onnx"])
    assert "random inputs" in line and "TiB" in line and "memory budget" in line
    assert "--dim s77=1000000000" in line


def test_a_huge_sample_count_is_refused_and_leaves_no_temp_folder(user_files, capsys,
                                                                 monkeypatch):
    temp = user_files / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    line = run_refused(capsys, ["m.onnx", "--against-reference-evaluator", "--samples",
                                "1000000000000"], [user_files / "m.onnx"])
    assert str(MAX_SAMPLES) in line
    with pytest.raises(UsageError, match="--samples"):
        bisect_onnx.bisect_onnx_models("m.onnx", reference_runtime="onnx.reference",
                                       inputs=bisect_onnx.RandomInputs(samples=10**12))
    assert list(temp.iterdir()) == []


# --- empty and non-regular files ---------------------------------------------------------

def test_an_empty_onnx_file_is_named_as_empty(user_files, capsys):
    Path("empty.onnx").write_bytes(b"")
    line = run_refused(capsys, ["model.py:make", "--input", "x.npy", "--onnx", "empty.onnx"],
                       [user_files / "x.npy"])
    assert "empty.onnx is empty" in line
    with pytest.raises(InputError, match="is empty"):
        bisect_onnx.bisect_onnx_models("empty.onnx", reference_runtime="onnx.reference")


def test_an_empty_npz_is_named_as_holding_no_arrays(user_files, capsys):
    np.savez(user_files / "none.npz")
    line = run_refused(capsys, ["model.py:make", "--input", "none.npz"],
                       [user_files / "none.npz"])
    assert "holding no arrays" in line


@pytest.mark.parametrize("name,option", [("empty.py", None), ("tolerances.txt",
                                                               "--tolerances")])
def test_other_empty_files_are_named_as_empty(user_files, capsys, name, option):
    Path(name).write_bytes(b"")
    argv = (["m.onnx", "--against-reference-evaluator", option, name] if option
            else [f"{name}:make", "--input", "x.npy"])
    assert "is empty" in run_refused(capsys, argv, [user_files / name])


def test_a_fifo_as_input_is_refused_not_waited_on(user_files):
    os.mkfifo(user_files / "pipe.npy")
    result = subprocess.run([sys.executable, "-m", "bisect_onnx", "model.py:make", "--input",
                             "pipe.npy"], cwd=user_files, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 2, result.stderr
    assert "is not a regular file (a FIFO)" in result.stderr


# --- vacuous verdicts --------------------------------------------------------------------

def test_outputs_below_atol_give_parity_with_a_warning(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(scale_model(1e-9), str(path))
    report = bisect_onnx.bisect_onnx_models(path, inputs=np.ones((2, 3), np.float32),
                                            reference_runtime="onnx.reference",
                                            tolerance=(1e-3, 1e-5))
    assert not report.diverged
    vacuous = [warning for warning in report.warnings
               if getattr(warning, "code", "") == "vacuous-small"]
    assert vacuous and "1e-09" in vacuous[0] and "meaningless" in vacuous[0]


def test_zero_size_inputs_give_parity_with_a_warning(tmp_path):
    path = tmp_path / "empty_batch.onnx"
    onnx.save(scale_model(shape=("batch", 3)), str(path))
    report = bisect_onnx.bisect_onnx_models(path, inputs=np.ones((0, 3), np.float32),
                                            reference_runtime="onnx.reference")
    assert not report.diverged
    assert [warning.code for warning in report.warnings
            if getattr(warning, "code", "").startswith("vacuous")] == ["vacuous-empty"]


def test_ordinary_parity_has_no_vacuity_warning(tmp_path):
    path = tmp_path / "scale.onnx"
    onnx.save(scale_model(), str(path))
    report = bisect_onnx.bisect_onnx_models(path, inputs=np.ones((2, 3), np.float32),
                                            reference_runtime="onnx.reference")
    assert not any(getattr(warning, "code", "").startswith("vacuous")
                   for warning in report.warnings)


def test_pytorch_outputs_below_atol_are_said(user_files, capsys):
    Path("tiny.py").write_text(
        "import torch\n"
        "class Tiny(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 1e-9\n"
        "def make():\n"
        "    return Tiny()\n")
    assert main(["tiny.py:make", "--input", "x.npy", "-q"]) == 0
    captured = capsys.readouterr()
    assert "PARITY" in captured.out
    assert "parity is meaningless" in captured.err and "1e-09" in captured.err
