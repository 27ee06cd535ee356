"""Several models that decode as one (fairseq, Marian and Sockeye decode ensembles this way).

Each model encodes the source and keeps its own decoder cache; at every step the next-token
distribution is the mean of the models' log-probabilities (a log-linear ensemble, Sockeye's
`log_linear`), which the search normalises again. fairseq averages the probabilities instead;
the mean of log-probabilities is what the ensemble was asked for here, and it keeps an ensemble
of a model with itself exactly that model (the mean of two equal numbers is that number).

An `Ensemble` offers what the search uses of a `Transformer` (`config`, `encode`,
`init_cache`, `decode_step`), so every search runs on it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from model.transformer import DecoderCache, Transformer


@dataclass
class EnsembleCache:
    caches: list[DecoderCache]  # one per model

    def reorder(
        self, index: Tensor, group: int = 1, same_sentences: bool | None = None
    ) -> EnsembleCache:
        """As `DecoderCache.reorder`, for every model's cache."""
        return EnsembleCache([c.reorder(index, group, same_sentences) for c in self.caches])


class Ensemble:
    """Models over one vocabulary (the caller checks that they share their tokenizer)."""

    def __init__(self, models: list[Transformer]):
        if len(models) < 2:
            raise ValueError(f"an ensemble needs 2 models or more, got {len(models)}")
        vocab = {m.generator.out_features for m in models}
        if len(vocab) != 1:
            raise ValueError(f"the models' vocabularies differ in size: {sorted(vocab)}")
        starts = {m.config.decoder_start for m in models}
        if len(starts) != 1:  # every step feeds all of them the same tokens
            raise ValueError(f"the models' decoders start from different tokens: {sorted(starts)}")
        self.models = models
        # The shortest position table limits every member.
        limit = min(m.config.max_positions for m in models)
        self.config = replace(models[0].config, max_positions=limit)

    def encode(self, src: Tensor, src_pad_mask: Tensor) -> list[Tensor]:
        """Each model's memory (B, S, D_m)."""
        return [m.encode(src, src_pad_mask) for m in self.models]

    def init_cache(
        self, memories: list[Tensor], src_pad_mask: Tensor, steps: int = 0
    ) -> EnsembleCache:
        caches = [m.init_cache(x, src_pad_mask, steps) for m, x in zip(self.models, memories)]
        return EnsembleCache(caches)

    def decode_step(self, tokens: Tensor, cache: EnsembleCache) -> Tensor:
        """The mean of the models' next-token log-probabilities (N, V), float32."""
        log_probs = [
            F.log_softmax(m.decode_step(tokens, c).float(), dim=-1)
            for m, c in zip(self.models, cache.caches)
        ]
        return torch.stack(log_probs).mean(dim=0)
