"""Captioned digits: image-caption pairs built deterministically from data a package ships.

The images are scikit-learn's ``load_digits`` (1797 handwritten 8x8 digits, inside the
package: no download), upscaled to the model's input size. Each image gets a caption
composed from templates, its label and one attribute read off the image itself: the ink
("thick" or "thin": the image's total ink against the median of its class in the training
split). So a caption says two things an image shows, and the paraphrases (templates) say
them in five ways:

    "a photo of a thick seven"    "the digit seven written in thick strokes"
    "a scan of the number 7 in thick ink"  ...

The held-out split (20 %, a fixed permutation: the same whatever the training seed) is
what quality is measured on (quality.py): zero-shot classification with prompts per class,
and image<->text retrieval where an item counts as a match when it says the same (digit,
ink) as the query's own pair, since paraphrases cannot be told apart from the image.

Preprocessing (upscaling, a random shift of up to an eighth of the image in training) runs
in DataLoader worker processes. A sample's randomness is a function of (seed, epoch,
index) only (the sampler hands out keys ``epoch * n + index``), so the vision rank's
images and the text rank's captions of a step are the same pairs, and equal the
single-device run's, whichever worker made them.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

SPLITS = ("train", "test")
MODALITIES = ("image", "text", "both")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
INKS = ("thin", "thick")
TEMPLATES = (
    "a photo of a {ink} {word}",
    "a {ink} handwritten {word}",
    "the digit {word} written in {ink} strokes",
    "a scan of the number {numeral} in {ink} ink",
    "{ink} strokes forming a {word}",
)
PAD, BOS, EOS, UNK = 0, 1, 2, 3
_SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
_SPLIT_SEED = 20240917  # the held-out split does not move with the training seed
TEST_FRACTION = 0.2
# Pixel statistics of the upscaled, shifted training images (ink 0..16 scaled to 0..1),
# measured once:
# constants, so every split and every worker normalises the same way.
_MEAN, _STD = 0.28, 0.32


class Tokenizer:
    """Whole words of the caption vocabulary; <bos> words <eos> <pad>... of a fixed length.

    The text tower reads its features at <eos> (causal attention: that token has seen
    every word and no padding)."""

    context_length = 16

    def __init__(self) -> None:
        words: list[str] = list(_SPECIALS)
        for text in (*TEMPLATES, *DIGIT_WORDS, *INKS, *map(str, range(10))):
            for word in text.split():
                if not word.startswith("{") and word not in words:
                    words.append(word)
        self.words = tuple(words)
        self._ids = {w: i for i, w in enumerate(self.words)}

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, caption: str) -> torch.Tensor:
        words = caption.lower().split()
        if len(words) + 2 > self.context_length:
            raise ValueError(
                f"caption {caption!r} has {len(words)} words; at most "
                f"{self.context_length - 2} fit the context of {self.context_length}"
            )
        ids = [BOS, *(self._ids.get(w, UNK) for w in words), EOS]
        return torch.tensor(ids + [PAD] * (self.context_length - len(ids)), dtype=torch.long)

    def decode(self, tokens: torch.Tensor) -> str:
        out = []
        for token in tokens.tolist():
            if token == EOS:
                break
            if token not in (PAD, BOS):
                out.append(self.words[token])
        return " ".join(out)


def caption(label: int, ink: int, template: int) -> str:
    return TEMPLATES[template].format(word=DIGIT_WORDS[label], numeral=str(label), ink=INKS[ink])


def class_prompts(label: int) -> list[str]:
    """Every caption of a class (templates x inks): CLIP's prompt ensemble for zero-shot."""
    return [caption(label, ink, t) for t in range(len(TEMPLATES)) for ink in range(len(INKS))]


@cache
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.asarray(digits.images, dtype=np.float32) / 16.0
    return images, np.asarray(digits.target, dtype=np.int64)


@cache
def _split() -> dict[str, np.ndarray]:
    images, _ = _digits()
    order = np.random.Generator(np.random.PCG64(_SPLIT_SEED)).permutation(len(images))
    n_test = round(len(images) * TEST_FRACTION)
    return {"test": np.sort(order[:n_test]), "train": np.sort(order[n_test:])}


@cache
def _ink_attribute() -> np.ndarray:
    """1 (thick) where an image's ink exceeds its class's training-split median, else 0."""
    images, labels = _digits()
    ink = images.sum(axis=(1, 2))
    train = _split()["train"]
    median = np.array([np.median(ink[train][labels[train] == c]) for c in range(10)])
    return (ink > median[labels]).astype(np.int64)


def _sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([seed, epoch, index]))


class CaptionedDigits(Dataset):
    """One split of the pairs. Items are dicts with ``image`` (1, S, S) float32 and/or
    ``tokens`` (context_length,) int64 (``modality``), plus ``label`` and ``group`` (the
    (digit, ink) class a caption describes: what retrieval counts as a match).

    Indexed by key ``epoch * len(self) + index`` (StepBatchSampler makes them): the
    training split's caption template and shift are drawn from (seed, epoch, index); the
    test split has neither augmentation nor a seed (template ``index % 5``, no shift)."""

    def __init__(
        self, split: str, *, seed: int = 0, image_size: int = 32, modality: str = "both"
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is not one of: {', '.join(SPLITS)}")
        if modality not in MODALITIES:
            raise ValueError(f"modality {modality!r} is not one of: {', '.join(MODALITIES)}")
        if image_size < 8:
            raise ValueError(f"image_size {image_size} is smaller than the digits' 8 pixels")
        self.split, self.seed, self.image_size, self.modality = split, seed, image_size, modality
        self.rows = _split()[split]
        self.tokenizer = Tokenizer()

    def __len__(self) -> int:
        return len(self.rows)

    def labels(self) -> torch.Tensor:
        return torch.from_numpy(_digits()[1][self.rows])

    def groups(self) -> torch.Tensor:
        """(digit, ink) as one int per item: label * 2 + ink."""
        return self.labels() * len(INKS) + torch.from_numpy(_ink_attribute()[self.rows])

    def _image(self, row: int, shift: tuple[int, int]) -> torch.Tensor:
        pixels = torch.from_numpy(_digits()[0][row])[None, None]
        size = self.image_size
        image = F.interpolate(pixels, size=(size, size), mode="bilinear", align_corners=False)[0]
        if shift != (0, 0):
            pad = size // 8
            image = F.pad(image, (pad, pad, pad, pad))
            top, left = pad + shift[0], pad + shift[1]
            image = image[:, top : top + size, left : left + size]
        return ((image - _MEAN) / _STD).contiguous()

    def __getitem__(self, key: int) -> dict[str, Any]:
        epoch, index = divmod(int(key), len(self.rows))
        row = int(self.rows[index])
        label = int(_digits()[1][row])
        ink = int(_ink_attribute()[row])
        if self.split == "train":
            rng = _sample_rng(self.seed, epoch, index)
            template = int(rng.integers(len(TEMPLATES)))
            reach = self.image_size // 8
            shift = (int(rng.integers(-reach, reach + 1)), int(rng.integers(-reach, reach + 1)))
        else:
            template, shift = index % len(TEMPLATES), (0, 0)
        item: dict[str, Any] = {"label": label, "group": label * len(INKS) + ink}
        if self.modality in ("image", "both"):
            item["image"] = self._image(row, shift)
        if self.modality in ("text", "both"):
            item["tokens"] = self.tokenizer.encode(caption(label, ink, template))
        return item

    def everything(self) -> dict[str, torch.Tensor]:
        """The whole split in index order, epoch 0 (for evaluation)."""
        items = [self[i] for i in range(len(self))]
        return {k: torch.stack([torch.as_tensor(it[k]) for it in items]) for k in items[0]}


class StepBatchSampler(Sampler[list[int]]):
    """The batches of steps [start_step, start_step + steps): each a list of keys, every
    epoch a fresh permutation from (seed, epoch), the last partial batch dropped. A step's
    batch is a function of (seed, step) alone, so a resumed job and every rank draw the
    same rows."""

    def __init__(
        self, n: int, batch_size: int, seed: int, *, start_step: int = 0, steps: int
    ) -> None:
        if batch_size > n:
            raise ValueError(f"batch_size {batch_size} is larger than the {n} training pairs")
        if start_step < 0 or steps < 0:
            raise ValueError(f"start_step {start_step} and steps {steps} must be >= 0")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.start_step, self.steps = start_step, steps
        self.per_epoch = n // batch_size

    def __len__(self) -> int:
        return self.steps

    def keys(self, step: int) -> list[int]:
        epoch, position = divmod(step, self.per_epoch)
        order = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.n)
        rows = order[position * self.batch_size : (position + 1) * self.batch_size]
        return [epoch * self.n + int(i) for i in rows]

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start_step, self.start_step + self.steps):
            yield self.keys(step)


def _one_thread(_: int) -> None:
    # Preprocessing is a few small interpolations: a worker with torch's default thread
    # pool would only contend with the rank's own compute for the cores.
    torch.set_num_threads(1)


def make_loader(
    dataset: CaptionedDigits, sampler: StepBatchSampler, *, workers: int, pin_memory: bool
) -> DataLoader:
    """The rank's loader: ``workers`` processes preprocess ahead of the step (0: inline);
    on a GPU, batches land in pinned memory so the copy to the device is asynchronous."""
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        worker_init_fn=_one_thread if workers else None,
        prefetch_factor=2 if workers else None,
    )
