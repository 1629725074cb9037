"""Offline datasets and the deterministic, resumable samplers."""

from __future__ import annotations

import json
import socket

import pytest
import torch
from gpuflow.tasks.training.data import (
    DATASETS,
    ImageBatchSampler,
    ImageDataset,
    TextDataset,
    TokenBatchSampler,
    build_dataset,
    eval_batches,
    eval_token_batches,
    make_sampler,
    pydoc_topics_corpus,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def digits() -> ImageDataset:
    dataset = build_dataset("digits")
    assert isinstance(dataset, ImageDataset)
    return dataset


def take(sampler: TokenBatchSampler | ImageBatchSampler, n: int) -> list[tuple[torch.Tensor, ...]]:
    return [next(sampler) for _ in range(n)]


def assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


# ---------------------------------------------------------------- datasets


def test_datasets_load_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("dataset loading tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    text = build_dataset("pydoc-topics")
    images = build_dataset("digits")
    assert isinstance(text, TextDataset) and isinstance(images, ImageDataset)


def test_pydoc_corpus_is_deterministic_and_split_at_the_tail() -> None:
    corpus = pydoc_topics_corpus()
    assert len(corpus) > 100_000
    assert corpus == pydoc_topics_corpus()
    from pydoc_data.topics import topics

    first = sorted(topics)[0]
    assert corpus.startswith(f"{first}\n{topics[first]}".encode())
    corpus.decode("utf-8")
    dataset = build_dataset("pydoc-topics")
    assert isinstance(dataset, TextDataset)
    assert dataset.train + dataset.eval == corpus
    assert abs(len(dataset.eval) / len(corpus) - 0.1) < 0.001
    smaller = build_dataset("pydoc-topics", eval_fraction=0.2)
    assert isinstance(smaller, TextDataset) and len(smaller.eval) > len(dataset.eval)


def test_digits_split_sizes_normalisation_and_seed(digits: ImageDataset) -> None:
    assert digits.train_inputs.shape == (1617, 1, 8, 8)
    assert digits.eval_inputs.shape == (180, 1, 8, 8)
    assert digits.train_inputs.dtype == torch.float32
    assert digits.train_targets.dtype == torch.int64 and digits.train_targets.shape == (1617,)
    assert set(digits.train_targets.tolist()) == set(range(10)) == set(digits.eval_targets.tolist())
    assert abs(digits.train_inputs.mean().item()) < 1e-4
    assert abs(digits.train_inputs.std().item() - 1.0) < 1e-3
    again = build_dataset("digits")
    other = build_dataset("digits", seed=1)
    assert isinstance(again, ImageDataset) and isinstance(other, ImageDataset)
    assert torch.equal(again.eval_inputs, digits.eval_inputs)
    assert not torch.equal(other.eval_targets, digits.eval_targets)
    # Every image lands in exactly one part: the raw pixel sums are preserved in total.

    def total(d: ImageDataset) -> torch.Tensor:
        return (d.train_inputs * d.std + d.mean).sum() + (d.eval_inputs * d.std + d.mean).sum()

    torch.testing.assert_close(total(digits), total(other), rtol=1e-5, atol=1.0)


def test_unknown_dataset_and_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'.*pydoc-topics.*digits"):
        build_dataset("imagenet")
    with pytest.raises(ValueError, match="eval_fraction"):
        build_dataset("digits", eval_fraction=1.5)
    with pytest.raises(ValueError, match="seed"):
        build_dataset("digits", seed=-1)
    assert set(DATASETS) == {"pydoc-topics", "digits"}


# ---------------------------------------------------------------- token sampler


def test_token_batches_are_shifted_windows_of_the_corpus() -> None:
    corpus = pydoc_topics_corpus()[:20_000]
    sampler = TokenBatchSampler(corpus, seq_len=32, batch_size=4, seed=3)
    inputs, targets = next(sampler)
    assert inputs.shape == targets.shape == (4, 32) and inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    for row_in, row_tgt in zip(inputs, targets, strict=True):
        window = bytes(row_in.tolist()) + bytes([int(row_tgt[-1])])
        assert window in corpus


def test_token_epoch_visits_disjoint_windows_and_reshuffles() -> None:
    corpus = bytes(range(256)) * 8  # 2048 bytes
    sampler = TokenBatchSampler(corpus, seq_len=15, batch_size=8, seed=0)
    per_epoch = sampler.batches_per_epoch
    assert per_epoch == ((2048 - 15) // 16) // 8
    first = torch.cat([x for x, _ in take(sampler, per_epoch)])
    # Byte value = position mod 256, so window starts sit on one grid of stride seq_len + 1:
    # windows of length seq_len + 1 on such a grid never overlap.
    starts = first[:, 0]
    assert ((starts - starts[0]) % 16 == 0).all()
    assert sampler.epoch == 0 and sampler.position == per_epoch
    second = torch.cat([x for x, _ in take(sampler, per_epoch)])
    assert sampler.epoch == 1
    assert not torch.equal(first, second)
    other_seed = TokenBatchSampler(corpus, seq_len=15, batch_size=8, seed=1)
    assert not torch.equal(next(other_seed)[0], first[:8])


@pytest.mark.parametrize("k", [0, 1, 5, 11, 12, 13, 30])
def test_token_sampler_resume_yields_exactly_the_remaining_batches(k: int) -> None:
    corpus = pydoc_topics_corpus()[:6_000]
    make = lambda: TokenBatchSampler(corpus, seq_len=31, batch_size=15, seed=42)  # noqa: E731
    reference = take(make(), k + 15)  # 12 batches an epoch: crosses two epoch boundaries
    assert make().batches_per_epoch == 12

    interrupted = make()
    take(interrupted, k)
    state = json.loads(json.dumps(interrupted.state_dict()))  # survives any checkpoint format
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.batches_seen == k
    assert_same_batches(take(resumed, 15), reference[k:])


def test_token_sampler_refuses_state_of_other_data_or_shape() -> None:
    corpus = pydoc_topics_corpus()[:6_000]
    sampler = TokenBatchSampler(corpus, seq_len=31, batch_size=15, seed=42)
    take(sampler, 3)
    state = sampler.state_dict()
    fresh = TokenBatchSampler(corpus, seq_len=31, batch_size=15, seed=42)
    for bad, match in [
        (dict(state, seq_len=64), "seq_len"),
        (dict(state, data_digest="0" * 16), "data_digest"),
        (dict(state, position=99), "position"),
        (dict(state, epoch=-1), "epoch"),
        ({k: v for k, v in state.items() if k != "seed"}, "lacks seed"),
        (dict(state, kind="image"), "kind"),
    ]:
        with pytest.raises(ValueError, match=match):
            fresh.load_state_dict(bad)
        assert fresh.state_dict()["position"] == 0  # nothing changed
    other_corpus = TokenBatchSampler(corpus[1:], seq_len=31, batch_size=15, seed=42)
    with pytest.raises(ValueError, match="data_digest"):
        other_corpus.load_state_dict(state)


def test_token_sampler_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="fewer than one batch"):
        TokenBatchSampler(b"short corpus", seq_len=8, batch_size=4)
    with pytest.raises(ValueError, match="seq_len"):
        TokenBatchSampler(b"x" * 1000, seq_len=0, batch_size=4)
    with pytest.raises(ValueError, match="batch_size"):
        TokenBatchSampler(b"x" * 1000, seq_len=8, batch_size=0)
    with pytest.raises(ValueError, match="corpus must be bytes"):
        TokenBatchSampler("text", seq_len=8, batch_size=1)  # type: ignore[arg-type]


# ---------------------------------------------------------------- image sampler


def test_image_epoch_is_a_permutation_and_resume_is_exact(digits: ImageDataset) -> None:
    make = lambda: ImageBatchSampler(  # noqa: E731
        digits.train_inputs, digits.train_targets, batch_size=100, seed=5
    )
    sampler = make()
    assert sampler.batches_per_epoch == 16  # 1617 // 100, the partial batch is dropped
    epoch = take(sampler, 16)
    labels = torch.cat([y for _, y in epoch])
    assert len(labels) == 1600
    # Each example at most once in an epoch: compare against the source's label histogram.
    assert (torch.bincount(labels, minlength=10) <= torch.bincount(digits.train_targets)).all()
    reference = take(make(), 40)
    for k in (0, 7, 16, 23):
        interrupted = make()
        take(interrupted, k)
        resumed = make()
        resumed.load_state_dict(interrupted.state_dict())
        assert_same_batches(take(resumed, 40 - k), reference[k:])
    other = ImageBatchSampler(digits.eval_inputs, digits.eval_targets, batch_size=100, seed=5)
    with pytest.raises(ValueError, match="data_digest"):
        other.load_state_dict(make().state_dict())


def test_make_sampler_picks_the_right_kind(digits: ImageDataset) -> None:
    text = build_dataset("pydoc-topics")
    assert isinstance(make_sampler(text, batch_size=16, seq_len=128), TokenBatchSampler)
    assert isinstance(make_sampler(digits, batch_size=32), ImageBatchSampler)
    with pytest.raises(ValueError, match="needs seq_len"):
        make_sampler(text, batch_size=16)


# ---------------------------------------------------------------- eval batches


def test_eval_batches_are_fixed_and_cover_the_eval_split(digits: ImageDataset) -> None:
    text = build_dataset("pydoc-topics")
    assert isinstance(text, TextDataset)
    a = eval_batches(text, batch_size=16, seq_len=128)
    b = eval_batches(text, batch_size=16, seq_len=128)
    assert_same_batches(a, b)
    n_windows = len(text.eval) // 129
    assert sum(len(x) for x, _ in a) == n_windows
    assert bytes(a[0][0][0].tolist()) == text.eval[:128]
    assert len(eval_batches(text, batch_size=16, seq_len=128, max_batches=2)) == 2
    images = eval_batches(digits, batch_size=64)
    assert [len(x) for x, _ in images] == [64, 64, 52]
    assert torch.equal(torch.cat([y for _, y in images]), digits.eval_targets)
    with pytest.raises(ValueError, match="needs seq_len"):
        eval_batches(text, batch_size=16)
    with pytest.raises(ValueError, match="shorter than seq_len"):
        eval_token_batches(b"abc", seq_len=8, batch_size=1)
