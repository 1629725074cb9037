"""The dual encoder: parts built from the seed alone, the int8 text tower, checkpointing."""

from __future__ import annotations

import pytest
import torch
from gpuflow.tasks.multimodal.model import (
    HEAD,
    PARTS,
    TEXT,
    VISION,
    ClipConfig,
    ClipModel,
    Int8Linear,
    build_part,
    clip_config,
    clip_loss,
    parameter_count,
    trainable,
)

CONFIG = clip_config("clip-tiny", vocab_size=39, context_length=16)


def _batch(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(n, 1, 32, 32, generator=g)
    tokens = torch.randint(4, 39, (n, 16), generator=g)
    tokens[:, 0], tokens[:, 9], tokens[:, 10:] = 1, 2, 0
    return images, tokens


def test_a_part_is_a_function_of_config_seed_and_part() -> None:
    torch.manual_seed(123)  # the global generator must not matter, and must not move
    before = torch.random.get_rng_state()
    text = build_part(TEXT, CONFIG, seed=4)
    assert torch.equal(before, torch.random.get_rng_state())
    whole = ClipModel.build(CONFIG, seed=4)
    for a, b in zip(text.state_dict().values(), whole.text.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    other = build_part(TEXT, CONFIG, seed=5)
    assert not torch.equal(other.token.weight, text.token.weight)


def test_loss_is_symmetric_infonce_over_the_batch() -> None:
    img = torch.randn(5, 8)
    txt = torch.randn(5, 8)
    scale = torch.tensor(2.0)
    loss = clip_loss(img, txt, scale)
    assert torch.allclose(loss, clip_loss(txt, img, scale))
    # Matched pairs far more similar than the others: the loss goes to zero.
    assert float(clip_loss(img, img * 3, torch.tensor(4.6))) < 0.05
    # The learned scale is clamped at 100 (exp 4.605...).
    assert torch.equal(
        clip_loss(img, txt, torch.tensor(9.0)), clip_loss(img, txt, torch.tensor(20.0))
    )


def test_int8_text_tower_freezes_its_block_weights_and_trains_the_rest() -> None:
    plain = build_part(TEXT, CONFIG, seed=0)
    quant = build_part(TEXT, CONFIG, seed=0, text_int8=True)
    linears = [m for m in quant.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 4 * CONFIG.text_layers  # qkv, out and the two MLP layers
    counts = parameter_count(quant)
    assert counts["frozen"] == sum(m.weight_int8.numel() for m in linears)
    assert counts["trained"] + counts["frozen"] == parameter_count(plain)["trained"]
    names = {n for n, p in quant.named_parameters() if p.requires_grad}
    assert "token.weight" in names and "proj.weight" in names and "ln.weight" in names
    assert not any(n.endswith("qkv.weight") for n in names)
    # Weight-only int8 with a per-channel scale: within half a step of the fp32 weight.
    ref = plain.blocks[0].attn.qkv.weight
    q = linears[0]
    err = (q.weight_int8.float() * q.scale[:, None] - ref).abs().max(dim=1).values
    assert bool((err <= q.scale / 2 + 1e-7).all())
    _, tokens = _batch()
    out = quant(tokens)
    out.sum().backward()
    assert quant.token.weight.grad is not None and q.bias.grad is not None
    assert torch.allclose(out, plain(tokens), atol=0.05)


def test_checkpointing_keeps_the_gradients_and_saves_activation_memory() -> None:
    from gpuflow.tasks.multimodal.memory import ActivationMeter

    images, _ = _batch(16)
    grads, peaks = {}, {}
    for on in (False, True):
        tower = build_part(VISION, CONFIG, seed=0, checkpointing=on)
        meter = ActivationMeter()
        with meter.step():
            tower(images).square().sum().backward()
        grads[on] = [p.grad for p in tower.parameters()]
        peaks[on] = meter.peak_bytes
    for a, b in zip(grads[False], grads[True], strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert 0 < peaks[True] < peaks[False] / 2, peaks


def test_config_refuses_shapes_that_do_not_divide() -> None:
    with pytest.raises(ValueError, match="not a multiple of patch_size"):
        ClipConfig(image_size=30, patch_size=8)
    with pytest.raises(ValueError, match="text_width 60 does not split into 8 heads"):
        ClipConfig(text_width=60, text_heads=8)
    with pytest.raises(ValueError, match="clip-huge"):
        clip_config("clip-huge", vocab_size=10, context_length=8)
    with pytest.raises(ValueError, match="part 'audio'"):
        build_part("audio", CONFIG, 0)


def test_fingerprint_tells_sizes_and_int8_apart() -> None:
    assert CONFIG.fingerprint() != CONFIG.fingerprint(text_int8=True)
    other = clip_config("clip-small", vocab_size=39, context_length=16)
    assert other.fingerprint() != CONFIG.fingerprint()


def test_every_part_trains() -> None:
    model = ClipModel.build(CONFIG, seed=0)
    images, tokens = _batch()
    model(images, tokens).backward()
    for part in PARTS:
        assert all(p.grad is not None for p in trainable(model.part(part))), part
    assert model.part(HEAD).logit_scale.grad is not None
