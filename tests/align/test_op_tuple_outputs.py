"""Recurrent ops with several outputs and layers: the look inside names the layer's node.

Dynamo: a two-layer ``nn.LSTM`` is one ``aten.lstm`` whose ONNX nodes are each layer's
LSTM, Transpose and Reshape; its row is the ``getitem`` taking its output. A weight
planted in the second layer's LSTM was named at the op's last node, the Reshape: the
look inside the culprit's op found no nodes for the ``getitem`` and gave up.

TorchScript: ``aten::gru`` takes its weights as one list, which could not be called
alone ("computed in the graph"); and its zero state is an Expand of a shape in the
file but a weight of the op alone, so the GRU's node was "not compared before it".
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from tests.planting import (
    bisect_torchscript_with_scaled_weight,
    export_dynamo,
    plant,
    scale_initializer_input,
)
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED


class _WordModel(nn.Module):
    """A two-layer LSTM and its decoder, as PyTorch's word language model."""

    def __init__(self, cell: str = "LSTM"):
        super().__init__()
        self.rnn = getattr(nn, cell)(8, 8, num_layers=2)
        self.decoder = nn.Linear(8, 5)

    def forward(self, x):
        output, _ = self.rnn(x)
        return self.decoder(output)


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    torch.manual_seed(0)
    model, x = _WordModel().eval(), torch.randn(6, 2, 8)
    return model, x.numpy(), export_dynamo(model, x, tmp_path_factory.mktemp("lstm"))


def _lstm_weight_planted(clean: Path, folder: Path, which: int = 0) -> tuple[str, Path]:
    """A copy of ``clean`` whose LSTM node ``which`` has its recurrent weight (input 2)
    scaled by 1.05: the node's name and the copy's path."""
    name = [node.name for node in onnx.load(str(clean)).graph.node
            if node.op_type == "LSTM"][which]
    planted = folder / "planted.onnx"
    recurrent_weight = 2
    plant(clean, planted, scale_initializer_input(name, recurrent_weight, 1.05))
    return name, planted


def test_a_weight_of_the_second_lstm_layer_is_named_at_its_node(export, tmp_path):
    model, x, clean = export
    second, planted = _lstm_weight_planted(clean, tmp_path, which=1)

    report = bisect_onnx.bisect(model, x, onnx_model=planted)

    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == second, report.summary()
    assert report.culprit.torch_op == "aten.lstm.input", report.summary()


@LEGACY_EXPORTER_DEPRECATED
def test_a_weight_of_a_torchscript_gru_layer_is_named_at_its_node(tmp_path):
    torch.manual_seed(0)
    model, x = _WordModel("GRU").eval(), torch.randn(6, 2, 8)
    recurrent_weight = 2

    report = bisect_torchscript_with_scaled_weight(model, x, tmp_path, "/rnn/GRU",
                                                   recurrent_weight)

    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == "/rnn/GRU", report.summary()
    assert report.inside_op is not None and report.inside_op.node == "/rnn/GRU"


class _FinalStates(nn.Module):
    """An LSTM's output and its last hidden state, the cell state unused (PyTorch's
    bidirectional LSTM test model): the file keeps the LSTM's Y and Y_h, not Y_c."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 4, 1, batch_first=True, bidirectional=True)

    def forward(self, x):
        output, (hidden, _) = self.lstm(x)
        return output.flatten(1) + hidden.sum()


@pytest.fixture(scope="module")
def final_states(tmp_path_factory):
    torch.manual_seed(0)
    model, x = _FinalStates().eval(), torch.randn(2, 5, 8)
    return model, x.numpy(), export_dynamo(model, x, tmp_path_factory.mktemp("states"))


def test_the_hidden_and_cell_states_are_not_both_paired_with_y_h(final_states):
    """Both are [2, 2, 4]; one leaves the call: the cell state was compared with Y_h."""
    model, x, clean = final_states

    report = bisect_onnx.bisect(model, x, onnx_model=clean,
                                search=bisect_onnx.SearchOptions(granularity="module"))

    assert report.verdict == "parity", report.summary()
    assert not any(row.failed for row in report.comparisons), report.table(show="all")
    assert "lstm[1][1]" not in {row.torch_module for row in report.comparisons}


def test_a_weight_of_the_call_traced_alone_is_named_at_its_lstm(final_states, tmp_path):
    """The call's outputs are getitems no node of the call reads: named by the file."""
    model, x, clean = final_states
    lstm, planted = _lstm_weight_planted(clean, tmp_path)

    report = bisect_onnx.bisect(model, x, onnx_model=planted)

    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == lstm, report.summary()
