"""The architecture set in ``fixtures/architectures.py``, at its small size only.

Each model builds, runs and has the structure its docstring promises; one test per
model exports it with the dynamo exporter and checks ONNX Runtime against PyTorch.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fixtures.architectures import (
    ARCHITECTURES,
    BilinearUp,
    Bottleneck,
    bert_base,
    gpt2,
    resnet50,
    unet,
    vit,
)
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED


def run(model: nn.Module, inputs: dict[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    """The model's outputs on numpy inputs, always as a tuple."""
    with torch.no_grad():
        out = model(**{name: torch.from_numpy(array) for name, array in inputs.items()})
    return out if isinstance(out, tuple) else (out,)


def count_calls(modules: dict[str, nn.Module], forward: Callable[[], object]) -> Counter[str]:
    """How many times each named module ran during ``forward()``."""
    calls: Counter[str] = Counter()
    handles = [module.register_forward_hook(lambda *_, name=name: calls.update([name]))
               for name, module in modules.items()]
    try:
        forward()
    finally:
        for handle in handles:
            handle.remove()
    return calls


def capture(module: nn.Module, forward: Callable[[], object], *,
            inputs_of: bool = False) -> torch.Tensor:
    """A copy of what ``module`` returned (or, with ``inputs_of``, was given) in ``forward()``."""
    seen = []
    if inputs_of:
        handle = module.register_forward_pre_hook(lambda _m, args: seen.append(args[0].clone()))
    else:
        handle = module.register_forward_hook(lambda _m, _i, out: seen.append(out.clone()))
    try:
        forward()
    finally:
        handle.remove()
    (tensor,) = seen
    return tensor


# ---------------------------------------------------------------------------
# Every architecture.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_factory_is_seeded_eval_and_inputs_fit_forward(name):
    arch = ARCHITECTURES[name]
    first, second = arch.factory("small"), arch.factory("small")
    assert not first.training and not any(m.training for m in first.modules())
    for (key, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name}.{key} differs between two builds"

    inputs = arch.make_inputs("small")
    assert list(inputs) == list(inspect.signature(first.forward).parameters)
    again = arch.make_inputs("small")
    assert all(np.array_equal(inputs[key], again[key]) for key in inputs)
    assert any(not np.array_equal(inputs[key], arch.make_inputs("small", seed=1)[key])
               for key in inputs)
    for output in run(first, inputs):
        assert torch.isfinite(output).all()


@pytest.mark.parametrize("factory", [resnet50, bert_base, vit, gpt2, unet])
def test_an_unknown_size_names_the_choices(factory):
    with pytest.raises(ValueError, match="'medium' is not one of 'small', 'full'"):
        factory("medium")


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_norms_are_not_identities(name):
    model = ARCHITECTURES[name].factory("small")
    norms = [m for m in model.modules() if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm))]
    assert norms
    for norm in norms:
        assert not torch.allclose(norm.weight, torch.ones_like(norm.weight))
        assert not torch.allclose(norm.bias, torch.zeros_like(norm.bias))
        if isinstance(norm, nn.BatchNorm2d):
            assert ((0.5 <= norm.running_var) & (norm.running_var <= 1.5)).all()
            assert not torch.allclose(norm.running_var, torch.ones_like(norm.running_var))


# ---------------------------------------------------------------------------
# One architecture at a time.
# ---------------------------------------------------------------------------


def test_resnet50_reuses_one_relu_per_block_and_downsamples_each_stage():
    model, inputs = resnet50("small"), ARCHITECTURES["resnet50"].make_inputs("small")
    blocks = {name: m for name, m in model.named_modules() if isinstance(m, Bottleneck)}
    assert [name.split(".")[0] for name in blocks] == [
        "layer1", "layer2", "layer2", "layer3", "layer4"]
    # The first block of each stage changes channels (and, after layer1, stride).
    for name, block in blocks.items():
        if name.endswith(".0"):
            conv, bn = block.downsample
            assert isinstance(conv, nn.Conv2d) and conv.kernel_size == (1, 1)
            assert isinstance(bn, nn.BatchNorm2d)
        else:
            assert block.downsample is None
        assert block.relu.inplace

    relus = {f"{name}.relu": block.relu for name, block in blocks.items()}
    assert count_calls(relus, lambda: run(model, inputs)) == {name: 3 for name in relus}

    stages = {f"layer{i}": getattr(model, f"layer{i}") for i in range(1, 5)}
    shapes = [tuple(capture(stage, lambda: run(model, inputs)).shape)
              for stage in stages.values()]
    assert shapes == [(1, 32, 16, 16), (1, 64, 8, 8), (1, 128, 4, 4), (1, 256, 2, 2)]
    assert run(model, inputs)[0].shape == (1, 10)


def test_bert_padding_does_not_reach_the_tokens():
    model, inputs = bert_base("small"), ARCHITECTURES["bert_base"].make_inputs("small")
    mask = inputs["attention_mask"]
    assert mask.dtype == np.int64 and inputs["input_ids"].dtype == np.int64
    assert mask[0, :-2].all() and not mask[0, -2:].any()
    assert (inputs["input_ids"] < 100).all()
    hidden, pooled = run(model, inputs)
    assert hidden.shape == (1, 16, 64) and pooled.shape == (1, 64)

    padding_changed = {**inputs, "input_ids": inputs["input_ids"].copy()}
    padding_changed["input_ids"][0, -2:] = (inputs["input_ids"][0, -2:] + 1) % 100
    other_hidden, other_pooled = run(model, padding_changed)
    torch.testing.assert_close(other_hidden[:, :-2], hidden[:, :-2])
    torch.testing.assert_close(other_pooled, pooled)

    # The same edit with the mask all ones does reach them: the mask is what hid it.
    unmasked = {**inputs, "attention_mask": np.ones_like(mask)}
    changed_unmasked = {**padding_changed, "attention_mask": np.ones_like(mask)}
    assert not torch.allclose(run(model, unmasked)[0][:, :-2],
                              run(model, changed_unmasked)[0][:, :-2])


def test_bert_layers_have_separate_projections_and_modules_for_gelu_and_dropout():
    layer = bert_base("small").layers[0]
    attention = layer.attention
    assert all(isinstance(getattr(attention, p), nn.Linear) for p in ("q", "k", "v", "out"))
    assert isinstance(attention.dropout, nn.Dropout)
    assert isinstance(layer.feed_forward.act, nn.GELU)
    assert layer.feed_forward.act.approximate == "none"


def test_gpt2_is_causal_and_ties_the_lm_head():
    model, inputs = gpt2("small"), ARCHITECTURES["gpt2"].make_inputs("small")
    assert model.lm_head.weight is model.wte.weight
    # GELU is a function call inside the MLP, with no module of its own.
    assert not any(isinstance(module, nn.GELU) for module in model.modules())
    (logits,) = run(model, inputs)
    assert logits.shape == (1, 16, 100)

    ids = inputs["input_ids"].copy()
    ids[0, -1] = (ids[0, -1] + 1) % 100
    (changed,) = run(model, {"input_ids": ids})
    torch.testing.assert_close(changed[:, :-1], logits[:, :-1])
    assert not torch.allclose(changed[:, -1], logits[:, -1])

    # And the other way round: the first token reaches every later position.
    ids = inputs["input_ids"].copy()
    ids[0, 0] = (ids[0, 0] + 1) % 100
    (changed,) = run(model, {"input_ids": ids})
    assert all(not torch.allclose(changed[:, i], logits[:, i]) for i in range(16))


def test_vit_embeds_each_patch_on_its_own_and_prepends_a_class_token():
    model, inputs = vit("small"), ARCHITECTURES["vit"].make_inputs("small")
    (logits,) = run(model, inputs)
    assert logits.shape == (1, 10)
    tokens = capture(model.blocks[0], lambda: run(model, inputs))
    assert tokens.shape == (1, 1 + (32 // 8) ** 2, 64)

    # Changing pixels inside the top-left 8x8 patch changes only that patch's embedding.
    before = capture(model.patch_embed, lambda: run(model, inputs)).flatten(2)
    edited = inputs["images"].copy()
    edited[..., :8, :8] += 1.0
    after = capture(model.patch_embed, lambda: run(model, {"images": edited})).flatten(2)
    changed = (after - before).abs().amax(dim=1)[0]
    assert changed[0] > 0 and (changed[1:] == 0).all()


def test_unet_upsamples_with_conv_transpose_and_bilinear_resize(monkeypatch):
    model, inputs = unet("small"), ARCHITECTURES["unet"].make_inputs("small")
    assert isinstance(model.decoders[0].up, nn.ConvTranspose2d)
    assert isinstance(model.decoders[1].up, BilinearUp)

    interpolations = []

    def interpolate(*args, **kwargs):
        interpolations.append((kwargs["mode"], kwargs["align_corners"]))
        return original(*args, **kwargs)

    original = F.interpolate
    monkeypatch.setattr(F, "interpolate", interpolate)
    (out,) = run(model, inputs)
    assert interpolations == [("bilinear", False)]
    assert out.shape == (1, 2, 32, 32)

    # Each decoder level concatenates its encoder level's skip with the upsampled map.
    merged = [capture(decoder.conv, lambda: run(model, inputs), inputs_of=True)
              for decoder in model.decoders]
    assert [tuple(m.shape) for m in merged] == [(1, 32, 16, 16), (1, 16, 32, 32)]


# ---------------------------------------------------------------------------
# The one export test: what the fixtures exist for.
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ARCHITECTURES)
@DYNAMO_LEAFSPEC_DEPRECATED
def test_dynamo_export_matches_in_onnx_runtime(name):
    import onnxruntime as ort

    arch = ARCHITECTURES[name]
    model, inputs = arch.factory("small"), arch.make_inputs("small")
    args = tuple(torch.from_numpy(array) for array in inputs.values())
    program = torch.onnx.export(model, args, dynamo=True, verbose=False)
    session = ort.InferenceSession(program.model_proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(inputs)
    got = session.run(None, inputs)
    want = run(model, inputs)
    assert len(got) == len(want)
    for actual, expected in zip(got, want, strict=True):
        np.testing.assert_allclose(actual, expected.numpy(), rtol=1e-4, atol=1e-5)
