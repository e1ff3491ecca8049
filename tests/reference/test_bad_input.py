"""Archives and files a check refuses: one line each, exit status 2, no data read first."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from tests.planting import plant, scale_conv_weight

pytestmark = pytest.mark.filterwarnings("ignore::bisect_onnx.BisectOnnxWarning")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, fixture_case):
    """A reference of the avgpool fixture, recorded once for every test here."""
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    folder = tmp_path_factory.mktemp("recorded")
    return bisect_onnx.record(model, inputs, path=folder / "ref.npz", onnx_model=onnx_path)


@pytest.fixture
def no_array_read(monkeypatch):
    """Fail if any array's data is read (the headers are read by other functions)."""
    def refuse(*args, **kwargs):
        raise AssertionError("an array was read before the archive was checked")

    monkeypatch.setattr(np.lib.format, "read_array", refuse)


def rewritten(source, target, *, manifest=None, members=None, drop=()):
    """A copy of the archive ``source`` with its manifest edited and members replaced."""
    members = members or {}
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            if info.filename in drop or info.filename in members:
                continue
            data = old.read(info.filename)
            if info.filename == "manifest.json" and manifest is not None:
                data = json.dumps(manifest(json.loads(data))).encode()
            new.writestr(info.filename, data)
        for name, data in members.items():
            new.writestr(name, data)
    return target


def npy_bytes(array, *, allow_pickle=False):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


def refused(path, capsys, match):
    """The archive is refused by Reference.load and by the command, in one line."""
    with pytest.raises(bisect_onnx.InputError, match=match):
        bisect_onnx.Reference.load(path)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bisect-onnx: error: ")
    return err


def test_truncated_archive(recorded, tmp_path, capsys, no_array_read):
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(recorded.read_bytes()[: recorded.stat().st_size // 2])
    err = refused(truncated, capsys, "not a bisect-onnx reference archive")
    assert str(truncated) in err


def test_not_a_zip_and_a_plain_npz(tmp_path, capsys, no_array_read):
    (tmp_path / "text.npz").write_text("hello")
    assert "not a bisect-onnx reference archive" in refused(
        tmp_path / "text.npz", capsys, "not a bisect-onnx reference archive")
    np.savez(tmp_path / "plain.npz", x=np.zeros(3))
    assert "no manifest.json member" in refused(tmp_path / "plain.npz", capsys,
                                                "no manifest.json member")


def test_an_onnx_file_given_as_the_reference_is_told_to_go_with_onnx(
        fixture_case, tmp_path, capsys, no_array_read):
    _, _, onnx_path = fixture_case("avgpool_divisor")
    model = tmp_path / "model.onnx"
    model.write_bytes(Path(onnx_path).read_bytes())
    err = refused(model, capsys, "is an ONNX model, not a reference archive; pass the archive")
    assert "--record" not in err.split(";")[0] and "with --onnx" in err


def test_corrupt_data(recorded, tmp_path, capsys):
    data = bytearray(recorded.read_bytes())
    with zipfile.ZipFile(recorded) as archive:
        info = archive.getinfo("values/2.npy")
    # Past the member's local header and its .npy header: the array's last bytes.
    end = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size
    data[end - 8:end] = bytes(8)
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(bytes(data))
    # Found by the zip's CRC: at loading where the member is read whole with its header
    # (a small one), else when its array is read.
    with pytest.raises(bisect_onnx.InputError, match="Bad CRC-32 .* corrupt"):
        bisect_onnx.check(corrupt)
    assert main(["check", str(corrupt)]) == 2


def test_another_version_or_format(recorded, tmp_path, capsys, no_array_read):
    newer = rewritten(recorded, tmp_path / "v3.npz",
                      manifest=lambda manifest: {**manifest, "version": 3})
    err = refused(newer, capsys, "version 3; this bisect-onnx reads versions 1 and 2")
    assert "upgrade bisect-onnx" in err
    other = rewritten(recorded, tmp_path / "other.npz",
                      manifest=lambda manifest: {**manifest, "format": "something"})
    refused(other, capsys, "its manifest's format is 'something'")
    broken = rewritten(recorded, tmp_path / "broken.npz",
                       manifest=lambda manifest: {**manifest, "values": 3})
    refused(broken, capsys, "its manifest is malformed")
    missing = rewritten(recorded, tmp_path / "missing.npz", manifest=lambda manifest: {
        name: value for name, value in manifest.items() if name != "values"})
    refused(missing, capsys, "its manifest is malformed [(]no 'values' field[)]; record")
    for field in ("final_outputs", "rows"):  # a row without the value it shows
        nameless = rewritten(recorded, tmp_path / f"nameless_{field}.npz",
                             manifest=lambda manifest, field=field: {**manifest, field: [
                                 {key: value for key, value in row.items()
                                  if key != "onnx_value"} for row in manifest[field]]})
        refused(nameless, capsys, "its manifest is malformed [(]no 'onnx_value' field[)]")


def test_a_member_claiming_more_than_it_holds_or_the_budget(recorded, tmp_path, capsys,
                                                            no_array_read):
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (10 ** 12,)})
    huge = rewritten(recorded, tmp_path / "huge.npz",
                     members={"values/0.npy": header.getvalue() + bytes(16)})
    # Its header claims 4 TB and it holds 144 bytes: corrupt, however large the budget.
    refused(huge, capsys, r"'values/0.npy''s header claims float32 \[1000000000000\] .* and "
            "it holds .*; the archive is corrupt")
    assert main(["check", str(huge), "--max-memory", "10TiB"]) == 2
    assert "the archive is corrupt" in capsys.readouterr().err
    # A member that holds what it claims, over the budget.
    with pytest.raises(bisect_onnx.InputError, match="over the memory budget of 100 B"):
        bisect_onnx.Reference.load(recorded, max_memory=100)


@pytest.mark.parametrize("name", ["../evil.npy", "/etc/evil.npy", "values/../../evil.npy",
                                  "notes.txt"])
def test_a_member_name_it_does_not_write(recorded, tmp_path, capsys, no_array_read, name):
    escaping = rewritten(recorded, tmp_path / "escaping.npz",
                         members={name: npy_bytes(np.zeros(2))})
    err = refused(escaping, capsys, "is not one a reference archive holds")
    assert ("would escape the archive" in err) == (name != "notes.txt")


def test_a_pickle_anywhere(recorded, tmp_path, capsys, no_array_read):
    pickled = npy_bytes(np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for member in ("values/0.npy", "values/99.npy", "inputs/0.npy"):
        archive = rewritten(recorded, tmp_path / "pickled.npz", members={member: pickled})
        assert "only a pickle can hold" in refused(archive, capsys, "only a pickle can hold")


def test_a_member_the_manifest_names_is_missing(recorded, tmp_path, capsys, no_array_read):
    missing = rewritten(recorded, tmp_path / "missing.npz", drop={"values/1.npy"})
    assert "names member 'values/1.npy'" in refused(missing, capsys,
                                                    "names member 'values/1.npy'")


def test_an_onnx_file_of_another_graph(recorded, fixture_case, tmp_path, capsys):
    _, _, onnx_path = fixture_case("avgpool_divisor")
    other = tmp_path / "other.onnx"
    plant(onnx_path, other, scale_conv_weight("conv", 1.01))
    with pytest.raises(bisect_onnx.InputError, match="is not the graph the reference was "
                       "recorded on: initializer '.*' holds other values"):
        bisect_onnx.check(recorded, other)
    assert main(["check", str(recorded), "--onnx", str(other)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    report = bisect_onnx.check(recorded, other, allow_other_file=True)
    assert any("values compared by name, 5 of 5 recorded values named in it" in warning
               for warning in report.warnings)


def test_inputs_other_than_the_recorded_ones(recorded, fixture_case, tmp_path, capsys):
    _, inputs, _ = fixture_case("avgpool_divisor")
    np.save(tmp_path / "same.npy", inputs["x"])
    np.save(tmp_path / "other.npy", inputs["x"] * 2)
    assert main(["check", str(recorded), "--input", str(tmp_path / "same.npy"), "-q"]) == 1
    capsys.readouterr()
    assert main(["check", str(recorded), "--input", str(tmp_path / "other.npy")]) == 2
    err = capsys.readouterr().err
    size = inputs["x"].size
    assert ("input 'x' is not the one the reference was recorded on (" in err
            and "elements differ, the first at [0, 0, 0, 0], by up to " in err), err
    assert f" of {size} elements differ" in err



def test_a_recorded_file_changed_since_is_named_by_its_path(fixture_case, tmp_path, capsys):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    deployed = tmp_path / "model.onnx"
    deployed.write_bytes(Path(onnx_path).read_bytes())
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=deployed)
    _, _, other = fixture_case("tiny_mlp")
    deployed.write_bytes(Path(other).read_bytes())  # redeployed since, say
    assert main(["check", str(reference)]) == 2
    err = capsys.readouterr().err
    assert f"the recorded ONNX file {deployed} is not the graph the reference" in err, err


def test_a_graph_refused_after_its_capture_was_made_leaves_nothing_behind(
        recorded, fixture_case, tmp_path, monkeypatch):
    # The check makes its capture session (profiled) while the graph is hashed: a
    # graph then found not to be the recorded one lets go of it and its folder.
    import tempfile

    import onnxruntime

    _, _, onnx_path = fixture_case("avgpool_divisor")
    other = tmp_path / "other.onnx"
    plant(onnx_path, other, scale_conv_weight("conv", 1.01))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    profiled = []
    made = onnxruntime.InferenceSession

    def session(model, options=None, *args, **kwargs):
        profiled.append(options is not None and options.enable_profiling)
        return made(model, options, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    with pytest.raises(bisect_onnx.InputError, match="is not the graph the reference"):
        bisect_onnx.check(recorded, other)
    assert any(profiled)  # the capture session was made before the refusal
    assert not list(scratch.iterdir())


def test_another_models_file_let_through_by_name_is_told_its_inputs_do_not_fit(
        recorded, capsys):
    from fixtures.registry import FIXTURES, repo_path

    other = repo_path(FIXTURES["tiny_mlp"].onnx_file)
    assert main(["check", str(recorded), "--onnx", str(other), "--allow-other-file"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"the recorded inputs do not fit {other}: input 0" in err
    assert "check the file the reference was recorded on" in err


def test_write_fixed_onto_the_recorded_file_is_refused_through_the_api(fixture_case,
                                                                       tmp_path):
    # Without onnx_model the check reads the file the reference was recorded on.
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    deployed = tmp_path / "model.onnx"
    deployed.write_bytes(Path(onnx_path).read_bytes())
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=deployed)
    with pytest.raises(bisect_onnx.UsageError, match="is one of the input files"):
        bisect_onnx.check(reference, suggest_fix=bisect_onnx.FixOptions(write_fixed=deployed))


@pytest.mark.parametrize(("given", "recorded", "said"), [
    (np.array([1 + 1j]), np.array([1 + 2j]), "by up to 1"),  # the imaginary part counts
    (np.array([2**63 - 1]), np.array([2**63 - 2]), "by up to 1"),  # past float64's units
    (np.array([1.0, np.nan], np.float32), np.array([1.5, np.nan], np.float32), "by up to 0.5"),
])
def test_how_given_inputs_differ_is_told_in_their_own_kind(given, recorded, said):
    import warnings

    from bisect_onnx.runtime.recorded.runner import _how_values_differ

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning: nothing is dropped
        assert _how_values_differ(given, recorded).endswith(said)
