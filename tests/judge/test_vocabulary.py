"""The report's words: string enums that read and serialize as the schema's strings."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from bisect_onnx.judge.vocabulary import Granularity, ReportWarning, Status, Verdict


@pytest.mark.parametrize("word", [*Verdict, *Status, *Granularity])
def test_each_word_is_its_schema_string(word):
    assert word == word.value
    assert f"{word}" == str(word) == word.value
    assert json.dumps(word) == json.dumps(word.value)
    assert pickle.loads(pickle.dumps(word)) is word


def test_a_warning_is_its_text_and_keeps_its_code_when_filled_copied_or_pickled():
    template = ReportWarning("rule-unused", "tolerance rule {where} matched nothing")
    filled = template.format(where="tolerances.txt:3")
    assert filled == "tolerance rule tolerances.txt:3 matched nothing"
    assert json.loads(json.dumps([filled])) == [str(filled)]
    for again in (filled, copy.deepcopy(filled), pickle.loads(pickle.dumps(filled))):
        assert again.code == "rule-unused"
        assert again == filled
