"""``bisect-onnx check REF``: its refusals in the command line's words, not the API's."""

from __future__ import annotations

from pathlib import Path

import pytest

import bisect_onnx
from bisect_onnx.cli.command import main

pytestmark = pytest.mark.filterwarnings("ignore::bisect_onnx.BisectOnnxWarning")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, fixture_case):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    folder = tmp_path_factory.mktemp("recorded")
    return bisect_onnx.record(model, inputs, path=folder / "ref.npz", onnx_model=onnx_path)


@pytest.mark.parametrize("options, said", [
    (["--onnx", "missing.onnx"], "--onnx file missing.onnx does not exist"),
    (["--sweep"], "drop --sweep"),
    (["--granularity", "op"], "--granularity is the recording's; drop it"),
])
def test_refusals_name_the_option_given(reference, tmp_path, monkeypatch, capsys, options,
                                        said):
    monkeypatch.chdir(tmp_path)
    assert main(["check", str(reference), *options]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_no_output_is_written_over_the_onnx_file_the_reference_names(
        tmp_path, fixture_case, monkeypatch, capsys):
    """Without --onnx, the check reads the file the reference was recorded on."""
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    deployed = tmp_path / "deploy" / "model.onnx"
    deployed.parent.mkdir()
    deployed.write_bytes(Path(onnx_path).read_bytes())
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=deployed)
    before = deployed.read_bytes()
    monkeypatch.chdir(tmp_path)
    for options in (["--json", str(deployed)], ["--html", str(deployed)],
                    ["--repro-dir", str(deployed.parent)]):
        assert main(["check", str(reference), *options]) == 2, options
        err = capsys.readouterr().err
        assert "the recorded ONNX file" in err and err.count("\n") == 1, err
    with pytest.raises(bisect_onnx.UsageError, match="the recorded ONNX file"):
        bisect_onnx.check(reference, output=bisect_onnx.OutputOptions(
            repro_dir=deployed.parent))
    assert deployed.read_bytes() == before


def test_an_unknown_option_points_to_the_check_forms_help(reference, capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's own exit, with our status
        main(["check", str(reference), "--steps", "4"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --steps 4 (see bisect-onnx check --help)" in err
    assert err.count("\n") == 1
