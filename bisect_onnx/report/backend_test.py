"""A repro's case in the ONNX backend-test layout, the form an upstream issue asks for.

``<folder>/model.onnx`` beside ``<folder>/test_data_set_0/{input_<k>,output_0}.pb``;
:mod:`bisect_onnx.report.repro` saves the model there, this module the data set.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["DATA_SET", "write_backend_test"]

#: The one data set of the case, under the backend-test folder.
DATA_SET = "test_data_set_0"


def write_backend_test(folder: Path, feeds: Mapping[str, np.ndarray], output: str,
                       expected: np.ndarray) -> None:
    """ONNX's backend-test data set: TensorProto files (the model is already there)."""
    from onnx import numpy_helper

    data = folder / DATA_SET
    for position, (name, array) in enumerate(feeds.items()):
        (data / f"input_{position}.pb").write_bytes(
            numpy_helper.from_array(array, name).SerializeToString())
    (data / "output_0.pb").write_bytes(
        numpy_helper.from_array(expected, output).SerializeToString())
