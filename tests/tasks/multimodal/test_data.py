"""Captioned digits: pairs that agree across modalities, workers and resumes."""

from __future__ import annotations

import pytest
import torch
from gpuflow.tasks.multimodal.data import (
    EOS,
    INKS,
    TEMPLATES,
    CaptionedDigits,
    StepBatchSampler,
    Tokenizer,
    caption,
    class_prompts,
    make_loader,
)


def test_tokenizer_round_trip_and_eos() -> None:
    tok = Tokenizer()
    text = caption(7, 1, 2)
    assert text == "the digit seven written in thick strokes"
    tokens = tok.encode(text)
    assert tokens.shape == (tok.context_length,)
    assert tok.decode(tokens) == text
    assert int((tokens == EOS).sum()) == 1
    assert tok.decode(tok.encode("a purple seven")) == "a <unk> seven"


def test_tokenizer_refuses_a_caption_longer_than_its_context() -> None:
    with pytest.raises(ValueError, match="at most 14 fit"):
        Tokenizer().encode(" ".join(["seven"] * 15))


def test_splits_are_disjoint_fixed_and_cover_the_digits() -> None:
    train, test = CaptionedDigits("train", seed=3), CaptionedDigits("test", seed=9)
    assert len(train) + len(test) == 1797
    assert not set(train.rows.tolist()) & set(test.rows.tolist())
    # The held-out split does not move with the training seed.
    assert CaptionedDigits("test", seed=0).rows.tolist() == test.rows.tolist()
    assert sorted(set(test.labels().tolist())) == list(range(10))
    assert set(test.groups().tolist()) <= set(range(10 * len(INKS)))


def test_an_item_is_the_same_pair_in_every_modality() -> None:
    both = CaptionedDigits("train", seed=1, modality="both")
    image = CaptionedDigits("train", seed=1, modality="image")
    text = CaptionedDigits("train", seed=1, modality="text")
    for key in (0, 5, len(both) * 3 + 17):
        b, i, t = both[key], image[key], text[key]
        assert "tokens" not in i and "image" not in t
        assert torch.equal(b["image"], i["image"])
        assert torch.equal(b["tokens"], t["tokens"])
        words = both.tokenizer.decode(b["tokens"])
        label, ink = divmod(b["group"], len(INKS))
        assert label == b["label"]
        assert words in {caption(label, ink, k) for k in range(len(TEMPLATES))}


def test_training_items_vary_by_epoch_and_seed_test_items_do_not() -> None:
    train = CaptionedDigits("train", seed=0)
    n = len(train)
    epochs = [train[e * n + 4] for e in range(6)]
    assert any(not torch.equal(epochs[0]["image"], e["image"]) for e in epochs[1:])  # shifted
    assert len({tuple(e["tokens"].tolist()) for e in epochs}) > 1  # paraphrased
    again = CaptionedDigits("train", seed=0)
    assert all(torch.equal(again[e * n + 4]["image"], epochs[e]["image"]) for e in range(6))
    reseeded = CaptionedDigits("train", seed=1)
    assert any(not torch.equal(reseeded[k]["image"], train[k]["image"]) for k in range(8))
    test = CaptionedDigits("test", seed=0)
    assert torch.equal(test[2]["image"], test[len(test) + 2]["image"])
    assert torch.equal(test[2]["image"], CaptionedDigits("test", seed=5)[2]["image"])


def test_sampler_is_a_function_of_seed_and_step() -> None:
    whole = list(StepBatchSampler(100, 8, 5, steps=30))
    resumed = list(StepBatchSampler(100, 8, 5, start_step=17, steps=13))
    assert resumed == whole[17:]
    assert all(len(batch) == 8 for batch in whole)
    # An epoch (12 full batches of 100) draws each row at most once.
    first_epoch = [k for batch in whole[:12] for k in batch]
    assert len(set(first_epoch)) == len(first_epoch) and max(first_epoch) < 100
    assert min(k for batch in whole[12:24] for k in batch) >= 100  # epoch 1's keys


def test_sampler_refuses_a_batch_larger_than_the_data() -> None:
    with pytest.raises(ValueError, match="batch_size 64 is larger than the 10"):
        StepBatchSampler(10, 64, 0, steps=1)


@pytest.mark.parametrize("bad", [{"split": "val"}, {"modality": "audio"}, {"image_size": 4}])
def test_dataset_refuses_bad_arguments(bad: dict) -> None:
    args = {"split": "train", **bad}
    with pytest.raises(ValueError, match=str(next(iter(bad.values())))):
        CaptionedDigits(args.pop("split"), **args)


def test_worker_processes_give_the_inline_batches() -> None:
    data = CaptionedDigits("train", seed=2, image_size=16)
    inline = list(
        make_loader(data, StepBatchSampler(len(data), 16, 2, steps=3), workers=0, pin_memory=False)
    )
    workers = list(
        make_loader(data, StepBatchSampler(len(data), 16, 2, steps=3), workers=2, pin_memory=False)
    )
    for a, b in zip(inline, workers, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_class_prompts_cover_every_template_and_ink() -> None:
    prompts = class_prompts(3)
    assert len(set(prompts)) == len(TEMPLATES) * len(INKS)
    assert all("three" in p or " 3 " in p for p in prompts)
