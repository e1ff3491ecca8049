"""The command line's decode form (``--steps``): what it refuses before anything runs."""

from __future__ import annotations

import pytest

from bisect_onnx.cli.command import main

pytest.importorskip("transformers")


@pytest.mark.parametrize("option, target", [("--json", "prompt.npy"),
                                            ("--html", "decoders.py"),
                                            ("--save-onnx", "prompt.npy")])
def test_an_output_onto_an_input_is_refused_before_the_run(user_files, capsys, option, target):
    before = (user_files / target).read_bytes()
    status = main(["decoders.py:tiny_llama", "--steps", "1", "--input", "prompt.npy",
                   option, target])
    err = capsys.readouterr().err
    assert status == 2, err
    assert f"{option} {target}" in err and len(err.strip().splitlines()) == 1
    assert (user_files / target).read_bytes() == before


@pytest.mark.parametrize("options, flag", [(["--sweep"], "--sweep"),
                                           (["--samples", "3"], "--samples"),
                                           (["--dim", "batch=3"], "--dim"),
                                           (["--all-culprits"], "--all-culprits"),
                                           (["--granularity", "module"], "--granularity")])
def test_one_forward_options_a_decode_run_would_ignore_are_refused(user_files, capsys, options,
                                                                    flag):
    status = main(["decoders.py:tiny_llama", "--steps", "1", *options])
    err = capsys.readouterr().err
    assert status == 2, err
    assert f"{flag} does not apply to a decode run (--steps); drop it," in err
