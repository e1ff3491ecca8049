"""Which of a file's names is which cache entry, and a mapping of them checked (no models)."""

from __future__ import annotations

import pytest

from bisect_onnx.decode.layout import layout_of_names
from bisect_onnx.errors import UsageError

INPUTS = ["input_ids", "attention_mask", "pk0", "past_key_values.0.value"]
OUTPUTS = ["logits", "present.0.key", "present.0.value"]


def test_a_mapped_name_is_read_as_the_standard_one():
    layout = layout_of_names(INPUTS, OUTPUTS, {"past_key_values.0.key": "pk0"})
    assert layout.past == (("pk0", "past_key_values.0.value"),)


def test_a_mapping_from_a_name_that_is_not_standard_is_refused_naming_it():
    with pytest.raises(UsageError, match="'past.key.0' is not a standard name"):
        layout_of_names(INPUTS, OUTPUTS, {"past.key.0": "pk0"})


def test_a_mapping_to_a_name_the_file_lacks_is_refused_naming_it():
    with pytest.raises(UsageError, match="no input or output named 'pkey0'.*pk0"):
        layout_of_names(INPUTS, OUTPUTS, {"past_key_values.0.key": "pkey0"})


def test_a_layer_entry_missing_names_the_input_that_matched_nothing():
    with pytest.raises(UsageError, match=r"0.key missing \(pk0: not a name read here\)"):
        layout_of_names(INPUTS, OUTPUTS)


def test_one_file_name_mapped_twice_is_refused_naming_both():
    with pytest.raises(UsageError, match="past_key_values.0.key, past_key_values.0.value all "
                                         "map 'pk0'; map each"):
        layout_of_names(INPUTS, OUTPUTS, {"past_key_values.0.key": "pk0",
                                          "past_key_values.0.value": "pk0"})
