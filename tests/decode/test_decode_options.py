"""The decode options the command line builds, refused in the command line's words."""

from __future__ import annotations

import pytest

from bisect_onnx.cli.parser import build_parser
from bisect_onnx.decode.options import DecodeOptions
from bisect_onnx.errors import UsageError


@pytest.mark.parametrize("options, said", [
    (["--prompt-length", "0"], "--prompt-length takes 1 or more, got 0"),
    (["--cache-shape", "2,0,16"], "--cache-shape takes L,H,D, each at least 1, got '2,0,16'"),
    (["--cache-name", "logits"], "--cache-name takes STANDARD=NAME, got 'logits'"),
])
def test_bad_values_name_the_option(options, said):
    args = build_parser().parse_args(["m.py:f", "--steps", "1", *options])
    with pytest.raises(UsageError, match=said):
        DecodeOptions.from_args(args)
