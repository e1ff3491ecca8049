"""Hugging Face models end to end: parity when clean, a planted weight named at its node.

Tiny configs (hidden size 32, two layers), randomly initialised: nothing is downloaded.
Each architecture is exported once per exporter for this module. Skipped where
``transformers`` is not installed (the ``hf`` extra).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

pytest.importorskip("transformers")

import bisect_onnx  # noqa: E402
from bisect_onnx.events import CAPTURE_STARTED  # noqa: E402
from bisect_onnx.graph.provenance import read_torch_metadata  # noqa: E402
from bisect_onnx.runtime.input_specs import input_specs  # noqa: E402
from bisect_onnx.sources.random_inputs import synthesize_inputs, vocabulary_limits  # noqa: E402
from tests.hf.architectures import ARCHITECTURES, T5_ENCODER  # noqa: E402

CASES = [(name, exporter) for name, arch in ARCHITECTURES.items() for exporter in arch.exporters]
WRAPPER_FILE = "tests/hf/architectures.py"


@dataclass
class Exported:
    model: object
    inputs: np.ndarray
    path: Path
    report: bisect_onnx.Report
    python_warnings: list[warnings.WarningMessage]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(name, exporter)``: the model, its export and the clean run's report."""
    cache: dict[tuple[str, str], Exported] = {}

    def get(name: str, exporter: str) -> Exported:
        if (name, exporter) not in cache:
            import torch

            torch.manual_seed(0)
            arch = ARCHITECTURES[name]
            model = arch.build().eval()
            inputs = arch.make_input(np.random.default_rng(0))
            path = tmp_path_factory.mktemp(f"{name}-{exporter}") / "model.onnx"
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                report = bisect_onnx.bisect(
                    model, inputs,
                    export=bisect_onnx.ExportOptions(exporter=exporter, save_to=path))
            ours = [w for w in caught if issubclass(w.category, bisect_onnx.BisectOnnxWarning)]
            cache[name, exporter] = Exported(model, inputs, path, report, ours)
        return cache[name, exporter]

    return get


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_a_clean_export_is_at_parity_with_no_warning(exported, name, exporter):
    run = exported(name, exporter)
    assert run.report.verdict == "parity", run.report.summary()
    # Another layout's rounding (about 1e-6 on x86, under a tenth of atol) must not be
    # warned about as if it could hide a divergence: that was a false alarm on clean models.
    assert run.report.warnings == []
    assert run.python_warnings == []
    assert run.report.comparisons


@pytest.mark.parametrize("name", [name for name, exporter in CASES if exporter == "dynamo"])
def test_dynamo_records_point_at_the_modeling_file_and_the_wrappers_call(exported, name):
    run = exported(name, "dynamo")
    sources = [record.source for record in run.report.comparisons if record.source]
    modeling = [source for source in sources if _installed(source.file)]
    # Not one record is left pointing at the user's wrapper in place of the model's line.
    assert len(modeling) == len(sources) > 0
    # transformers 5.25 swaps some layers' forward for the `kernels` package's (RMSNorm).
    assert all("/transformers/" in source.file or "/kernels/" in source.file
               for source in modeling)
    assert any(source.file.endswith(ARCHITECTURES[name].modeling_file) for source in modeling)
    assert all(source.call_site is not None and source.call_site.file.endswith(WRAPPER_FILE)
               for source in modeling)


def _installed(path: str) -> bool:
    return "site-packages" in path or "dist-packages" in path


def _plant(source: Path, target: Path) -> onnx.NodeProto:
    """Perturb the weight of a weighted node (MatMul, Gemm, Conv) in the model's middle."""
    model = onnx.load(str(source))
    weights = {init.name: index for index, init in enumerate(model.graph.initializer)}
    weighted = [node for node in model.graph.node if node.op_type in ("MatMul", "Gemm", "Conv")
                and any(name in weights for name in node.input)]
    node = weighted[len(weighted) // 2]
    index = next(weights[name] for name in node.input if name in weights)
    init = model.graph.initializer[index]
    array = numpy_helper.to_array(init)
    # Scaled and shifted: a LayerNorm's zero-mean output cancels a shift alone.
    planted = (array * 1.5 + 0.05 * np.sign(array)).astype(array.dtype)
    model.graph.initializer[index].CopyFrom(numpy_helper.from_array(planted, init.name))
    onnx.save(model, str(target))
    return node


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_a_planted_weight_is_named_at_its_node(exported, name, exporter, tmp_path):
    run = exported(name, exporter)
    node = _plant(run.path, tmp_path / "planted.onnx")
    seen = []
    with bisect_onnx.events.listening(seen.append):
        report = bisect_onnx.bisect(run.model, run.inputs, onnx_model=tmp_path / "planted.onnx")
    traced = [event.detail for event in seen if event.kind == CAPTURE_STARTED
              and event.detail.startswith("pytorch ops")]
    assert report.verdict == "diverged"
    culprit = report.culprit
    assert culprit is not None, report.summary()
    assert culprit.onnx_node == node.name
    if exporter == "torchscript":  # op level, by the TorchScript pairing
        assert report.coverage.granularity == "op"
        return
    # Found, named and classified at module level: the module call around the culprit is
    # rerun in float64 (pinned on tuple outputs such as an attention's), nothing traced;
    # but GPT-2's Conv1D is three ONNX nodes (Reshape, Gemm, Reshape), so its ops are.
    assert (traced == []) != (name == "gpt2") and culprit.local.classification == "graph semantics"
    meta = read_torch_metadata({prop.key: prop.value for prop in node.metadata_props})
    assert culprit.torch_module == meta.scopes[-1]
    source = culprit.source
    line = Path(source.file).read_text(encoding="utf-8").splitlines()[source.line - 1]
    if name == "gpt2":  # the addmm in Conv1D's own forward, transformers' pytorch_utils.py
        assert source.file.endswith("pytorch_utils.py") and "addmm" in line
    else:
        assert source.file.endswith(ARCHITECTURES[name].modeling_file)
        assert culprit.torch_module.rsplit(".", 1)[-1] in line  # self.dense(...), self.o_proj
    assert source.call_site.file.endswith(WRAPPER_FILE)


def test_a_torchscript_export_failure_suggests_the_dynamo_exporter():
    import torch

    torch.manual_seed(0)
    llama = ARCHITECTURES["llama"]
    with pytest.raises(bisect_onnx.ModelError, match="--exporter dynamo") as caught:
        bisect_onnx.bisect(llama.build().eval(), llama.make_input(np.random.default_rng(0)),
                           export=bisect_onnx.ExportOptions(exporter="torchscript"))
    assert "enable_gqa" in str(caught.value)


def test_t5_under_the_dynamo_exporter_is_pointed_at_the_torchscript_exporter():
    import torch

    torch.manual_seed(0)
    model = T5_ENCODER.build().eval()
    inputs = T5_ENCODER.make_input(np.random.default_rng(0))
    try:
        bisect_onnx.assert_parity(model, inputs)
    except bisect_onnx.ModelError as error:
        message = str(error)
    else:
        pytest.skip("this torch's dynamo exporter exports T5 (pytorch/pytorch #136543 fixed)")
    assert "step 2 of 3" in message and "--exporter torchscript" in message


def test_random_inputs_from_an_onnx_file_go_to_forward_by_the_graphs_input_names(tmp_path):
    import onnxruntime
    import torch

    from tests.hf.architectures import gpt2

    torch.manual_seed(0)
    model = gpt2()
    path = tmp_path / "gpt2.onnx"
    tokens = torch.zeros((1, 8), dtype=torch.int64)
    torch.onnx.export(model, (tokens,), path, kwargs={"attention_mask": torch.ones_like(tokens)},
                      input_names=["input_ids", "attention_mask"], dynamo=True, verbose=False)
    seed = bisect_onnx.RandomInputs(seed=0)
    # By position, the mask would be forward's second parameter, the cache: exit 3.
    report = bisect_onnx.bisect(model, seed, onnx_model=path)
    graph = onnx.load(str(path))
    specs = input_specs(graph.graph)
    drawn = dict(zip([spec.name for spec in specs],
                     synthesize_inputs(specs, seed=seed.seed, int_high=vocabulary_limits(graph)),
                     strict=True))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = model(**{name: torch.from_numpy(array) for name, array in drawn.items()})
    error = np.abs(session.run(None, drawn)[0] - expected.logits.numpy()).max()
    # The report's output error is forward's, fed the draws by name.
    assert report.final_outputs[0].figures.max_abs_error == pytest.approx(float(error), rel=1e-3,
                                                                  abs=1e-7)
    assert report.comparisons


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_decoder_left_at_use_cache_true_is_told_to_turn_it_off(exporter):
    import torch

    from tests.hf.architectures import gpt2

    torch.manual_seed(0)
    model = gpt2(use_cache=True)  # the default of every Hugging Face decoder
    tokens = {"input_ids": ARCHITECTURES["bert"].make_input(np.random.default_rng(0))}
    with pytest.raises(bisect_onnx.ModelError) as caught:
        bisect_onnx.bisect(model, tokens, export=bisect_onnx.ExportOptions(exporter=exporter))
    message = str(caught.value)
    assert "returns a DynamicCache" in message and "model.config.use_cache = False" in message
    assert "--exporter" not in message  # the other exporter fails the same way
