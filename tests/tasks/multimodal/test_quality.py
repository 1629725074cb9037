"""Quality figures: recall and its chance level, checked against enumeration."""

from __future__ import annotations

import itertools

import pytest
import torch
from gpuflow.tasks.multimodal.data import CaptionedDigits
from gpuflow.tasks.multimodal.model import ClipModel, clip_config
from gpuflow.tasks.multimodal.quality import chance_recall_at, evaluate, recall_at


def test_recall_counts_any_match_in_the_top_k() -> None:
    similarity = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.3, 0.8], [0.7, 0.6, 0.1]])
    match = torch.tensor([[False, True, False], [False, True, False], [True, False, True]])
    assert recall_at(similarity, match, 1) == pytest.approx(1 / 3)  # row 2: 0.7 is a match
    assert recall_at(similarity, match, 2) == pytest.approx(2 / 3)
    assert recall_at(similarity, match, 5) == 1.0


@pytest.mark.parametrize("k", [1, 2, 3])
def test_chance_recall_is_the_mean_over_every_ranking(k: int) -> None:
    match = torch.tensor(
        [[True, False, False, True, False], [False, False, False, False, True], [True] * 5]
    )
    n = match.shape[1]
    hits = []
    for order in itertools.permutations(range(n)):
        top = list(order[:k])
        hits.append(match[:, top].any(dim=1).float())
    expected = float(torch.stack(hits).mean())
    assert chance_recall_at(match, k) == pytest.approx(expected)


def test_evaluate_gives_every_figure_in_range_and_restores_the_mode() -> None:
    held_out = CaptionedDigits("test")
    model = ClipModel.build(clip_config("clip-tiny", vocab_size=39, context_length=16), 0)
    model.train()
    out = evaluate(model, held_out)
    assert model.training
    for key in ("zero_shot_acc", "i2t_r1", "i2t_r5", "t2i_r1", "t2i_r5"):
        assert 0.0 <= out[key] <= 1.0 and 0.0 < out[f"{key}_chance"] < 1.0
    assert out["i2t_r1_chance"] < out["i2t_r5_chance"]
