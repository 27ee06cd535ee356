"""Validation: the dev sets' loss and perplexity, and BLEU and chrF of greedy decoding of a
subset of each direction's dev set, the directions no corpus trains (watched) apart."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from cli.config import DecodeConfig
from cli.inference.decoding import translate_ids
from cli.inference.requests import Guide
from cli.inference.scoring import score
from data.batching import Batch
from data.pipeline import TrainingData
from data.tokenizer import Tokenizer

# The summed smoothed loss and NLL of a batch under `model`, in the run's precision.
LossOf = Callable[[Batch, nn.Module], tuple[Tensor, Tensor]]


def direction_scores(
    per_direction: dict[str, dict[str, Any]], watched: Collection[str] = ()
) -> dict[str, float]:
    """dev_bleu and dev_chrf: the mean over the directions, which early stopping and best.pt
    follow (a direction is not worth more for having more dev sentences), but for those
    `watched` (no corpus trains them: `DataConfig.watched_directions`), whose mean is
    watched_bleu; with several directions, each one's too, as dev_bleu/es-en."""
    followed = [way for way in per_direction if way not in watched]
    metrics = {}
    for name in ("bleu", "chrf"):
        for mean, ways in (("dev", followed), ("watched", list(watched))):
            if ways:
                metrics[f"{mean}_{name}"] = sum(per_direction[w][name] for w in ways) / len(ways)
        if len(per_direction) > 1:
            metrics.update({f"dev_{name}/{d}": s[name] for d, s in per_direction.items()})
    return metrics


def validation_decode(decode: DecodeConfig) -> DecodeConfig:
    """Greedy search, always: dev BLEU, early stopping and best.pt follow the model, never a
    random draw (a reverse model's config for back-translation may well set sampling)."""
    return replace(
        decode,
        beam_size=1,
        nbest=1,
        sampling_topk=0,
        sampling_topp=1.0,
        sampling_temperature=1.0,
    )


@torch.no_grad()
def validate(
    model: nn.Module,
    data: TrainingData,
    tokenizer: Tokenizer,
    decode: DecodeConfig,
    device: torch.device,
    loss_of: LossOf,
) -> dict[str, float]:
    """Dev loss/perplexity over `data`'s dev sets and BLEU/chrF of greedy decoding of a subset
    of each direction's, of `model` (left in eval mode); the watched directions' apart (their
    loss and mean as watched_*: `direction_scores`)."""
    model.eval()
    per_set = {}
    for dev in data.dev_sets:
        # A decoder that writes the target language first is made to, as `tf translate`.
        guides = [Guide(forced=tuple(dev.forced))] * len(dev.src_ids) if dev.forced else None
        greedy = validation_decode(decode)
        hyps = translate_ids(model, tokenizer, dev.src_ids, greedy, device, guides=guides)
        texts = tokenizer.decode_tgt([h[0].tokens for h in hyps])
        per_set[dev.name] = score(texts, dev.refs)
    watched = [dev.name for dev in data.dev_sets if dev.watched]
    metrics = {
        **mean_loss(model, data.dev_batches, "dev", device, loss_of),
        **direction_scores(per_set, watched),
    }
    if data.watched_batches:
        metrics.update(mean_loss(model, data.watched_batches, "watched", device, loss_of))
    return metrics


def mean_loss(
    model: nn.Module, batches: list[Batch], name: str, device: torch.device, loss_of: LossOf
) -> dict[str, float]:
    """NAME_loss, NAME_nll, NAME_ppl: per target token of `batches`."""
    sums = torch.zeros(2, device=device)  # smoothed loss, NLL
    tokens = 0
    for batch in batches:
        batch = batch.to(device)
        sums += torch.stack(loss_of(batch, model))
        tokens += batch.n_tgt_tokens
    loss, nll = sums.tolist()
    return {
        f"{name}_loss": loss / tokens,
        f"{name}_nll": nll / tokens,
        f"{name}_ppl": math.exp(min(nll / tokens, 50)),
    }
