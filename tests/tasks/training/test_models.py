"""Behaviour of the Llama-style decoder, the ResNet family and the model registry."""

from __future__ import annotations

import math

import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from gpuflow.tasks.training.data import DATASETS
from gpuflow.tasks.training.models import (
    MODELS,
    Bottleneck,
    Llama,
    LlamaConfig,
    ResNet,
    build_model,
    lm_loss,
    model_spec,
)
from gpuflow.tasks.training.models.llama import Attention, apply_rope, rope_full, rope_tables
from gpuflow.tasks.training.models.resnet import STAGE_NAMES

torch.set_num_threads(1)


def tiny_config(**overrides: object) -> LlamaConfig:
    base = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)
    base.update(overrides)
    return LlamaConfig(**base)  # type: ignore[arg-type]


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- Llama


def test_llama_tiny_forward_backward_shapes_and_grads() -> None:
    model = build_model("llama-tiny", seed=0)
    spec = model_spec("llama-tiny")
    tokens = torch.randint(0, 256, (3, spec.seq_len))
    logits = model(tokens)
    assert logits.shape == (3, spec.seq_len, 256)
    loss = lm_loss(logits[:, :-1], tokens[:, 1:])
    # At initialisation the prediction is close to uniform over 256 bytes.
    assert abs(loss.item() - math.log(256)) < 1.0
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_llama_tiny_is_about_100k_params_and_count_matches_config() -> None:
    model = build_model("llama-tiny")
    assert 80_000 <= n_params(model) <= 130_000
    assert n_params(model) == model.config.num_parameters()
    untied = Llama(tiny_config(tie_embeddings=False, ffn_hidden_dim=48))
    assert untied.output.weight is not untied.tok_embeddings.weight
    assert n_params(untied) == untied.config.num_parameters()


def test_llama_100m_parameter_count_on_meta_device() -> None:
    spec = model_spec("llama-100m")
    config = LlamaConfig(**spec.config)
    assert 90e6 <= config.num_parameters() <= 110e6
    assert config.kv_heads < config.n_heads
    with torch.device("meta"):
        model = build_model("llama-100m")
    assert n_params(model) == config.num_parameters()


def test_tied_embeddings_share_one_matrix() -> None:
    model = Llama(tiny_config(tie_embeddings=True))
    assert model.output.weight is model.tok_embeddings.weight
    assert "rope_cos" not in model.state_dict()


def test_byte_lm_matches_the_design_measurement() -> None:
    spec = model_spec("byte-lm")
    config = LlamaConfig(**spec.config)
    assert (config.vocab_size, config.n_layers, config.dim, config.n_heads) == (256, 4, 256, 4)
    assert spec.seq_len == config.max_seq_len == 128
    assert (spec.batch_size, spec.lr, spec.optimizer) == (16, 3e-4, "adamw")
    assert spec.task == "lm" and spec.dataset == "pydoc-topics"


def test_gqa_matches_reference_attention_with_shared_kv_heads() -> None:
    torch.manual_seed(0)
    config = tiny_config(n_heads=4, n_kv_heads=2)
    attn = Attention(config)
    hd = config.head_dim
    # One fused projection: 4 query heads, then 2 key and 2 value heads.
    assert attn.wqkv.out_features == (4 + 2 + 2) * hd
    x = torch.randn(2, 7, config.dim)
    cos, sin = rope_tables(config.head_dim, 7)
    got = attn(x, *rope_full(cos, sin))

    # Reference: query head h attends with kv head h // 2, explicit softmax and causal mask.
    wq, wk, wv = attn.wqkv.weight.split((4 * hd, 2 * hd, 2 * hd))
    q = apply_rope((x @ wq.T).view(2, 7, 4, hd).transpose(1, 2), cos, sin)
    k = apply_rope((x @ wk.T).view(2, 7, 2, hd).transpose(1, 2), cos, sin)
    v = (x @ wv.T).view(2, 7, 2, hd).transpose(1, 2)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    heads = []
    for h in range(4):
        scores = q[:, h] @ k[:, h // 2].transpose(-1, -2) / math.sqrt(hd)
        scores = scores.masked_fill(~mask, float("-inf"))
        heads.append(F.softmax(scores, dim=-1) @ v[:, h // 2])
    want = attn.wo(torch.stack(heads, dim=1).transpose(1, 2).reshape(2, 7, 4 * hd))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rope_dot_product_depends_only_on_relative_position() -> None:
    torch.manual_seed(1)
    head_dim, length = 16, 40
    cos, sin = rope_tables(head_dim, length)
    q_vec, k_vec = torch.randn(head_dim), torch.randn(head_dim)
    q = apply_rope(q_vec.expand(length, head_dim), cos, sin)
    k = apply_rope(k_vec.expand(length, head_dim), cos, sin)
    for m, n, shift in [(3, 1, 10), (5, 5, 20), (2, 9, 30)]:
        torch.testing.assert_close(q[m] @ k[n], q[m + shift] @ k[n + shift], rtol=1e-4, atol=1e-4)
    # ... and it does depend on the distance (RoPE is not a no-op), and preserves norms.
    assert not torch.allclose(q[0] @ k[0], q[7] @ k[0], atol=1e-3)
    torch.testing.assert_close(q.norm(dim=-1), q_vec.norm().expand(length))


def test_causal_mask_future_tokens_do_not_change_earlier_logits() -> None:
    model = Llama(tiny_config()).eval()
    tokens = torch.randint(0, 64, (2, 12))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 64
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_llama_runs_under_bf16_autocast_on_cpu() -> None:
    model = Llama(tiny_config())
    tokens = torch.randint(0, 64, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(tokens)
    assert logits.dtype == torch.bfloat16
    loss = lm_loss(logits, tokens)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()


def test_llama_rejects_bad_input_and_config() -> None:
    model = Llama(tiny_config(max_seq_len=8))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        model(torch.zeros(9, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible by n_heads"):
        tiny_config(dim=30, n_heads=4)
    with pytest.raises(ValueError, match="n_kv_heads"):
        tiny_config(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="even"):
        tiny_config(dim=12, n_heads=4, n_kv_heads=4)
    with pytest.raises(ValueError, match="vocab_size"):
        tiny_config(vocab_size=0)
    with pytest.raises(ValueError, match="do not match"):
        lm_loss(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


# ---------------------------------------------------------------- ResNet


@pytest.mark.parametrize(
    ("name", "count"),
    [("resnet18", 11_689_512), ("resnet50", 25_557_032), ("resnet152", 60_192_808)],
)
def test_resnet_parameter_counts_match_the_published_ones(name: str, count: int) -> None:
    # Built on the meta device: shapes and counts without allocating or initialising weights.
    with torch.device("meta"):
        model = build_model(name)
    assert n_params(model) == count  # torchvision's counts (25.6M, 60.2M)


def test_resnet152_stage_layout() -> None:
    with torch.device("meta"):
        model = build_model("resnet152")
    assert isinstance(model, ResNet)
    assert [name for name, _ in model.named_children()] == list(STAGE_NAMES)
    assert [len(getattr(model, f"layer{i}")) for i in range(1, 5)] == [3, 8, 36, 3]
    assert all(isinstance(b, Bottleneck) for b in model.layer3)
    cuts = [name for name, _ in model.cut_points()]
    assert cuts[0] == "stem" and cuts[-1] == "head" and "layer3.35" in cuts
    assert len(cuts) == 2 + 3 + 8 + 36 + 3


def test_resnet18_digits_forward_backward() -> None:
    model = build_model("resnet18-digits", seed=0)
    spec = model_spec("resnet18-digits")
    assert spec.input_shape == (1, 8, 8) and spec.dataset == "digits"
    x = torch.randn(4, *spec.input_shape)
    logits = model(x)
    assert logits.shape == (4, 10)
    F.cross_entropy(logits, torch.tensor([0, 1, 2, 3])).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_bottleneck_resnet_small_stem_and_cut_points_equal_forward() -> None:
    model = build_model("resnet50", seed=0, width=8, num_classes=7, stem="small").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        h = x
        shapes = {}
        for name, unit in model.cut_points():
            h = unit(h)
            shapes[name] = tuple(h.shape)
    assert want.shape == (2, 7)
    torch.testing.assert_close(h, want)
    # Small stem keeps 32x32 into layer1; bottlenecks expand channels by 4.
    assert shapes["layer1.2"] == (2, 32, 32, 32)
    assert shapes["layer4.2"] == (2, 256, 4, 4)


def test_imagenet_stem_reduces_224_to_7x7_before_the_head() -> None:
    model = build_model("resnet18", seed=0, width=4).eval()
    with torch.no_grad():
        h = torch.randn(1, 3, 224, 224)
        for name, unit in model.stages()[:-1]:
            h = unit(h)
            if name == "stem":
                assert h.shape[-2:] == (56, 56)
        assert h.shape == (1, 32, 7, 7)
        assert model.head(h).shape == (1, 1000)


def test_resnet_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="stem"):
        build_model("resnet18", stem="tiny")
    with pytest.raises(ValueError, match="num_classes"):
        build_model("resnet18", num_classes=0)


@pytest.mark.slow
def test_resnet_exports_to_onnx_with_dynamo_and_runs_in_onnxruntime() -> None:
    model = build_model("resnet18-digits", seed=0, width=8).eval()
    x = torch.randn(2, 1, 8, 8)
    program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
    session = ort.InferenceSession(
        program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        want = model(x).numpy()
    assert abs(got - want).max() < 1e-4


# ---------------------------------------------------------------- registry


def test_registry_names_and_specs() -> None:
    for name in ("llama-tiny", "llama-small", "llama-100m", "byte-lm"):
        assert MODELS[name].task == "lm" and MODELS[name].seq_len
    for name in ("resnet18", "resnet50", "resnet152", "resnet18-digits"):
        assert MODELS[name].task == "image" and MODELS[name].num_classes
    for spec in MODELS.values():
        assert spec.dataset is None or spec.dataset in DATASETS
        assert spec.batch_size > 0 and spec.lr > 0
    with pytest.raises(TypeError):
        MODELS["x"] = MODELS["byte-lm"]  # type: ignore[index]


def test_unknown_model_and_setting_raise_value_error_listing_names() -> None:
    with pytest.raises(ValueError, match="unknown model 'gpt-5'.*llama-tiny.*resnet152"):
        build_model("gpt-5")
    with pytest.raises(ValueError, match="unknown model"):
        model_spec("resnet-9000")
    with pytest.raises(ValueError, match="no setting depth.*n_layers"):
        build_model("llama-tiny", depth=3)
    with pytest.raises(ValueError, match="seed"):
        build_model("llama-tiny", seed="1")


@pytest.mark.parametrize("name", ["llama-tiny", "resnet18-digits"])
def test_seeded_build_is_deterministic_and_leaves_global_rng_alone(name: str) -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = build_model(name, seed=7, width=8) if "resnet" in name else build_model(name, seed=7)
    assert torch.equal(torch.get_rng_state(), before)
    b = build_model(name, seed=7, width=8) if "resnet" in name else build_model(name, seed=7)
    c = build_model(name, seed=8, width=8) if "resnet" in name else build_model(name, seed=8)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())


def test_overrides_change_the_built_model() -> None:
    model = build_model("llama-tiny", n_layers=1, tie_embeddings=False)
    assert isinstance(model, Llama) and len(model.layers) == 1
    assert model.output.weight is not model.tok_embeddings.weight
    assert model_spec("llama-tiny").config["n_layers"] == 2  # the spec itself is unchanged
