"""How good a dual encoder is, on the held-out split of captioned digits (data.py).

* ``zero_shot_acc``: each image classified as the digit whose prompts (every template and
  ink, their features averaged: CLIP's prompt ensemble) it is most similar to.
* ``i2t_r{1,5}``: for each image, are any of the k captions most similar to it a match?
* ``t2i_r{1,5}``: for each caption, are any of the k most similar images a match?

A match says the same (digit, ink) as the query's own pair: paraphrases of one caption
cannot be told apart from the image, so requiring the very same caption would cap recall
at the share of its template. Each figure comes with ``<name>_chance``, the expected value
of a random ranking (exact, from the number of matches each query has), so "above chance"
can be read off the figures themselves.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from gpuflow.tasks.multimodal.data import DIGIT_WORDS, CaptionedDigits, class_prompts

RECALL_AT = (1, 5)


def recall_at(similarity: torch.Tensor, match: torch.Tensor, k: int) -> float:
    """Share of rows whose k most similar columns include a match."""
    top = similarity.topk(min(k, similarity.shape[1]), dim=1).indices
    return float(match.gather(1, top).any(dim=1).float().mean())


def chance_recall_at(match: torch.Tensor, k: int) -> float:
    """Expected recall@k of a uniformly random ranking: 1 - C(N-m, k) / C(N, k) per row."""
    n = match.shape[1]
    m = match.sum(dim=1).double()
    miss = torch.ones_like(m)
    for j in range(min(k, n)):
        miss = miss * ((n - m - j).clamp(min=0) / (n - j))
    return float((1 - miss).mean())


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, held_out: CaptionedDigits, batch: int = 512
) -> dict[str, float]:
    """The quality figures of ``model`` (a ClipModel) on ``held_out``; the model's
    train/eval mode is left as it was."""
    was_training = model.training
    model.eval()
    try:
        data = held_out.everything()
        device = next(model.parameters()).device
        images = torch.cat([model.encode_image(x.to(device)) for x in data["image"].split(batch)])
        texts = torch.cat([model.encode_text(x.to(device)) for x in data["tokens"].split(batch)])
        images, texts = F.normalize(images.float(), dim=-1), F.normalize(texts.float(), dim=-1)
        tok = held_out.tokenizer
        classes = []
        for label in range(len(DIGIT_WORDS)):
            prompts = torch.stack([tok.encode(p) for p in class_prompts(label)]).to(device)
            classes.append(F.normalize(model.encode_text(prompts).float(), dim=-1).mean(0))
        classes_t = F.normalize(torch.stack(classes), dim=-1)
    finally:
        model.train(was_training)

    labels = data["label"].to(images.device)
    groups = data["group"].to(images.device)
    similarity = images @ texts.t()
    match = groups[:, None] == groups[None, :]
    out = {
        "zero_shot_acc": float(((images @ classes_t.t()).argmax(1) == labels).float().mean()),
        "zero_shot_acc_chance": 1.0 / len(DIGIT_WORDS),
    }
    for k in RECALL_AT:
        out[f"i2t_r{k}"] = recall_at(similarity, match, k)
        out[f"t2i_r{k}"] = recall_at(similarity.t(), match.t(), k)
        # The match relation is symmetric: both directions have the same chance level.
        out[f"i2t_r{k}_chance"] = out[f"t2i_r{k}_chance"] = chance_recall_at(match, k)
    return out
