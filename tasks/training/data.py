"""Real training data that is on every machine, and deterministic, resumable samplers.

Two datasets need no download: the text of CPython's ``pydoc_data.topics`` (about 0.45 MB,
in the standard library) as a byte corpus, and scikit-learn's ``load_digits`` (1797 8x8
images of 10 digits, shipped inside the package).

Samplers are iterators whose whole state is a few ints (seed, epoch, position): a run that
saves ``state_dict()`` after k batches and loads it into a fresh sampler gets exactly the
batches k+1, k+2, ... that an uninterrupted run would have got. Each epoch's order comes from
numpy's PCG64 seeded by (seed, epoch), so it is the same on every platform and torch version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

PYDOC_TOPICS = "pydoc-topics"
DIGITS = "digits"
DATASETS = (PYDOC_TOPICS, DIGITS)

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class TextDataset:
    """A byte corpus split into train and eval parts; tokens are bytes (vocab 256)."""

    name: str
    train: bytes
    eval: bytes
    vocab_size: int = 256


@dataclass(frozen=True)
class ImageDataset:
    """Normalised float images (N, C, H, W) with int64 class targets (N,)."""

    name: str
    train_inputs: torch.Tensor
    train_targets: torch.Tensor
    eval_inputs: torch.Tensor
    eval_targets: torch.Tensor
    num_classes: int
    mean: float
    std: float


Dataset = TextDataset | ImageDataset


def _check_fraction(eval_fraction: float) -> None:
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction!r}")


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_seed(seed: object) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def pydoc_topics_corpus() -> bytes:
    """CPython's pydoc topic texts, sorted by topic name, as UTF-8 bytes.

    Sorted keys make the corpus independent of dict order; it still differs between CPython
    versions (the text is the running interpreter's documentation).
    """
    from pydoc_data.topics import topics

    parts = [f"{key}\n{topics[key]}\n\n" for key in sorted(topics)]
    return "".join(parts).encode("utf-8")


def load_pydoc_topics(eval_fraction: float = 0.1) -> TextDataset:
    """The pydoc corpus with its last ``eval_fraction`` of bytes held out for evaluation.

    A tail split, not a shuffled one: eval windows never overlap training windows.
    """
    _check_fraction(eval_fraction)
    corpus = pydoc_topics_corpus()
    split = len(corpus) - int(len(corpus) * eval_fraction)
    return TextDataset(name=PYDOC_TOPICS, train=corpus[:split], eval=corpus[split:])


def load_digits_dataset(eval_fraction: float = 0.1, seed: int = 0) -> ImageDataset:
    """sklearn's 8x8 digits as (N, 1, 8, 8) float32, split by a seeded permutation.

    Normalised with the training part's mean and std only, so eval data does not leak into
    the preprocessing.
    """
    _check_fraction(eval_fraction)
    _check_seed(seed)
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.asarray(digits.images, dtype=np.float32)
    targets = np.asarray(digits.target, dtype=np.int64)
    order = np.random.Generator(np.random.PCG64(seed)).permutation(len(images))
    n_eval = round(len(images) * eval_fraction)
    if n_eval < 1 or n_eval >= len(images):
        raise ValueError(f"eval_fraction {eval_fraction} leaves an empty train or eval split")
    eval_idx, train_idx = order[:n_eval], order[n_eval:]
    mean = float(images[train_idx].mean())
    std = float(images[train_idx].std())

    def tensor(idx: np.ndarray) -> torch.Tensor:
        return torch.from_numpy((images[idx] - mean) / std).unsqueeze(1).contiguous()

    return ImageDataset(
        name=DIGITS,
        train_inputs=tensor(train_idx),
        train_targets=torch.from_numpy(targets[train_idx]),
        eval_inputs=tensor(eval_idx),
        eval_targets=torch.from_numpy(targets[eval_idx]),
        num_classes=10,
        mean=mean,
        std=std,
    )


def build_dataset(name: str, *, eval_fraction: float = 0.1, seed: int = 0) -> Dataset:
    """Load a named offline dataset ("pydoc-topics" or "digits").

    ``seed`` chooses the digits split; the text split is a fixed tail and ignores it.
    """
    if name == PYDOC_TOPICS:
        return load_pydoc_topics(eval_fraction)
    if name == DIGITS:
        return load_digits_dataset(eval_fraction, seed)
    raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")


def _epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, epoch]))


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()[:16]


class _ResumableSampler:
    """Shared iterator and state logic; subclasses define an epoch's batches."""

    kind = ""

    def __init__(self, batch_size: int, seed: int) -> None:
        _check_positive("batch_size", batch_size)
        _check_seed(seed)
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.position = 0  # batches already yielded in the current epoch
        self._cached_epoch = -1
        # The data's identity: resuming against other data would silently change the batches.
        self._data_digest = ""

    def _plan_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def _batch(self, index: int) -> Batch:
        raise NotImplementedError

    @property
    def batches_per_epoch(self) -> int:
        raise NotImplementedError

    @property
    def batches_seen(self) -> int:
        """Batches yielded since epoch 0 began."""
        return self.epoch * self.batches_per_epoch + self.position

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self.position >= self.batches_per_epoch:
            self.epoch += 1
            self.position = 0
        if self._cached_epoch != self.epoch:
            self._plan_epoch(self.epoch)
            self._cached_epoch = self.epoch
        batch = self._batch(self.position)
        self.position += 1
        return batch

    def _shape_state(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size}

    def state_dict(self) -> dict[str, Any]:
        """Plain ints and strings: picklable, JSON-able, fits in any checkpoint."""
        return {
            "kind": self.kind,
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "data_digest": self._data_digest,
            **self._shape_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off. Everything is checked before anything changes."""
        expected = {"kind": self.kind, "data_digest": self._data_digest, **self._shape_state()}
        missing = sorted({"seed", "epoch", "position", *expected} - set(state))
        if missing:
            raise ValueError(f"sampler state lacks {', '.join(missing)}")
        for key, value in expected.items():
            if state[key] != value:
                raise ValueError(
                    f"sampler state has {key}={state[key]!r} but this sampler has {value!r}"
                )
        _check_seed(state["seed"])
        for key in ("epoch", "position"):
            value = state[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"sampler state {key} must be a non-negative int, got {value!r}")
        if state["position"] > self.batches_per_epoch:
            raise ValueError(
                f"sampler state position {state['position']} exceeds the "
                f"{self.batches_per_epoch} batches of an epoch"
            )
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._cached_epoch = -1


class TokenBatchSampler(_ResumableSampler):
    """Endless (inputs, targets) batches of byte windows, each (batch_size, seq_len) int64.

    Targets are the inputs shifted by one byte. An epoch cuts the corpus into non-overlapping
    windows of seq_len + 1 bytes from a random offset in [0, seq_len) (so window borders
    move between epochs), shuffles them and drops the last partial batch.
    """

    kind = "token"

    def __init__(self, corpus: bytes, seq_len: int, batch_size: int, seed: int = 0) -> None:
        _check_positive("seq_len", seq_len)
        super().__init__(batch_size, seed)
        if not isinstance(corpus, bytes | bytearray | memoryview):
            raise ValueError(f"corpus must be bytes, got {type(corpus).__name__}")
        corpus = bytes(corpus)
        # Windows available at the worst offset (seq_len - 1): every epoch has this many.
        n_windows = (len(corpus) - seq_len) // (seq_len + 1) if len(corpus) > seq_len else 0
        if n_windows < batch_size:
            raise ValueError(
                f"corpus of {len(corpus)} bytes gives {n_windows} windows of seq_len {seq_len}, "
                f"fewer than one batch of {batch_size}"
            )
        self.seq_len = seq_len
        self._n_windows = n_windows
        self._data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8)
        self._data_digest = _digest(corpus)
        self._span = torch.arange(seq_len + 1)
        self._starts = torch.empty(0, dtype=torch.int64)

    @property
    def batches_per_epoch(self) -> int:
        return self._n_windows // self.batch_size

    def _shape_state(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "seq_len": self.seq_len}

    def _plan_epoch(self, epoch: int) -> None:
        rng = _epoch_rng(self.seed, epoch)
        offset = int(rng.integers(self.seq_len))
        order = rng.permutation(self._n_windows)
        self._starts = torch.from_numpy(offset + order * (self.seq_len + 1))

    def _batch(self, index: int) -> Batch:
        starts = self._starts[index * self.batch_size : (index + 1) * self.batch_size]
        windows = self._data[starts[:, None] + self._span].long()
        return windows[:, :-1], windows[:, 1:]


class ImageBatchSampler(_ResumableSampler):
    """Endless (inputs, targets) batches drawn without replacement; reshuffled each epoch.

    The last partial batch of an epoch is dropped so every batch has the same shape.
    """

    kind = "image"

    def __init__(
        self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int, seed: int = 0
    ) -> None:
        super().__init__(batch_size, seed)
        if inputs.shape[0] != targets.shape[0]:
            raise ValueError(
                f"inputs ({inputs.shape[0]}) and targets ({targets.shape[0]}) differ in length"
            )
        if inputs.shape[0] < batch_size:
            raise ValueError(f"{inputs.shape[0]} examples are fewer than one batch of {batch_size}")
        self.inputs = inputs
        self.targets = targets
        self._data_digest = _digest(
            str(tuple(inputs.shape)).encode(),
            inputs.detach().cpu().contiguous().numpy().tobytes(),
            targets.detach().cpu().contiguous().numpy().tobytes(),
        )
        self._order = torch.empty(0, dtype=torch.int64)

    @property
    def batches_per_epoch(self) -> int:
        return self.inputs.shape[0] // self.batch_size

    def _plan_epoch(self, epoch: int) -> None:
        self._order = torch.from_numpy(_epoch_rng(self.seed, epoch).permutation(len(self.inputs)))

    def _batch(self, index: int) -> Batch:
        idx = self._order[index * self.batch_size : (index + 1) * self.batch_size]
        return self.inputs[idx], self.targets[idx]


def eval_token_batches(
    corpus: bytes, seq_len: int, batch_size: int, max_batches: int | None = None
) -> list[Batch]:
    """Fixed eval batches: consecutive non-overlapping windows from byte 0, in order.

    The last batch may be smaller; a corpus too short for one window gives ValueError.
    """
    _check_positive("seq_len", seq_len)
    _check_positive("batch_size", batch_size)
    if max_batches is not None:
        _check_positive("max_batches", max_batches)
    n_windows = len(corpus) // (seq_len + 1)
    if n_windows == 0:
        raise ValueError(f"eval corpus of {len(corpus)} bytes is shorter than seq_len + 1")
    data = torch.frombuffer(bytearray(corpus[: n_windows * (seq_len + 1)]), dtype=torch.uint8)
    windows = data.long().view(n_windows, seq_len + 1)
    batches = [(chunk[:, :-1], chunk[:, 1:]) for chunk in torch.split(windows, batch_size, dim=0)]
    return batches if max_batches is None else batches[:max_batches]


def eval_image_batches(
    inputs: torch.Tensor, targets: torch.Tensor, batch_size: int, max_batches: int | None = None
) -> list[Batch]:
    """Fixed eval batches in dataset order; the last batch may be smaller."""
    _check_positive("batch_size", batch_size)
    if max_batches is not None:
        _check_positive("max_batches", max_batches)
    if inputs.shape[0] != targets.shape[0]:
        raise ValueError(
            f"inputs ({inputs.shape[0]}) and targets ({targets.shape[0]}) differ in length"
        )
    batches = list(
        zip(torch.split(inputs, batch_size), torch.split(targets, batch_size), strict=True)
    )
    return batches if max_batches is None else batches[:max_batches]


def eval_batches(
    dataset: Dataset,
    *,
    batch_size: int,
    seq_len: int | None = None,
    max_batches: int | None = None,
) -> list[Batch]:
    """The dataset's fixed eval set as batches (text needs ``seq_len``)."""
    if isinstance(dataset, TextDataset):
        if seq_len is None:
            raise ValueError(f"dataset {dataset.name!r} is text: eval_batches needs seq_len")
        return eval_token_batches(dataset.eval, seq_len, batch_size, max_batches)
    if isinstance(dataset, ImageDataset):
        return eval_image_batches(
            dataset.eval_inputs, dataset.eval_targets, batch_size, max_batches
        )
    raise ValueError(f"not a dataset: {type(dataset).__name__}")


def make_sampler(
    dataset: Dataset, *, batch_size: int, seed: int = 0, seq_len: int | None = None
) -> TokenBatchSampler | ImageBatchSampler:
    """The training sampler for a dataset (text needs ``seq_len``)."""
    if isinstance(dataset, TextDataset):
        if seq_len is None:
            raise ValueError(f"dataset {dataset.name!r} is text: make_sampler needs seq_len")
        return TokenBatchSampler(dataset.train, seq_len, batch_size, seed)
    if isinstance(dataset, ImageDataset):
        return ImageBatchSampler(dataset.train_inputs, dataset.train_targets, batch_size, seed)
    raise ValueError(f"not a dataset: {type(dataset).__name__}")
