"""The byte-lm's fast path computes what the plain formulation computes.

Fused q/k/v and w1/w3 projections, the flip-based RoPE with cached tables, ``F.rms_norm``
and fp32 attention on CPU under autocast: each is checked against the straightforward
formula, so the speed-ups (measured by `gpuflow bench train`, never timed here) change no
behaviour.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gpuflow.tasks.training.models import Llama
from gpuflow.tasks.training.models.llama import (
    RMSNorm,
    SwiGLU,
    apply_rope,
    attention_dtype,
    rope_tables,
)

from tests.tasks.training.test_models import tiny_config as _config

torch.set_num_threads(1)


def test_rope_matches_the_half_split_formula() -> None:
    torch.manual_seed(0)
    cos, sin = rope_tables(16, 10)
    x = torch.randn(3, 2, 10, 16)
    x1, x2 = x[..., :8], x[..., 8:]
    want = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    torch.testing.assert_close(apply_rope(x, cos, sin), want)


def test_rms_norm_matches_the_fp32_formula_and_its_gradient() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 5, 24, requires_grad=True)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    got = norm(x)
    torch.testing.assert_close(got, want)
    (g_got,) = torch.autograd.grad(got.sum(), x)
    (g_want,) = torch.autograd.grad(want.sum(), x)
    torch.testing.assert_close(g_got, g_want)


def test_fused_swiglu_equals_separate_w1_w3() -> None:
    torch.manual_seed(0)
    mlp = SwiGLU(16, 40)
    w1, w3 = mlp.w13.weight.split(40)
    x = torch.randn(2, 3, 16)
    want = mlp.w2(F.silu(x @ w1.T) * (x @ w3.T))
    torch.testing.assert_close(mlp(x), want)


def test_rope_tables_are_cached_per_dtype_and_device_and_stay_out_of_state() -> None:
    model = Llama(_config())
    a = model.rope_tables_for(torch.bfloat16)
    assert a[0].dtype == torch.bfloat16 and a[0].shape == (16, model.config.head_dim)
    assert model.rope_tables_for(torch.bfloat16)[0] is a[0]  # cast once, then reused
    assert model.rope_tables_for(torch.float32)[0] is not a[0]
    assert not any("rope" in k for k in model.state_dict())
    # Moving the model gives new buffers: the old entries are never served for them.
    model.double()
    assert model.rope_tables_for(torch.bfloat16)[0] is not a[0]


def test_tables_first_built_under_inference_mode_train_later() -> None:
    model = Llama(_config())
    tokens = torch.randint(0, 64, (2, 8))
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(tokens).float().sum()
    loss.backward()  # would raise if a cached table were an inference tensor


def test_cpu_attention_runs_in_fp32_under_bf16_autocast_and_stays_close() -> None:
    assert attention_dtype("cpu", torch.bfloat16) is torch.float32
    assert attention_dtype("cuda", torch.bfloat16) is torch.bfloat16
    torch.manual_seed(0)
    model = Llama(_config()).eval()
    tokens = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        ref = model(tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(tokens)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), ref, rtol=0.05, atol=0.05)


def test_training_steps_are_deterministic_in_bf16() -> None:
    def run() -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = Llama(_config())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        tokens = torch.randint(0, 64, (2, 16))
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(tokens).float().flatten(0, 1), tokens.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(), run(), strict=True):
        assert torch.equal(a, b)
