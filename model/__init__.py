"""The Transformer, its loss and search: pure torch, no files, no text."""

from model.loss import label_smoothed_cross_entropy
from model.search import Hypothesis, beam_search, gnmt_length_penalty, greedy_search
from model.transformer import (
    DecoderCache,
    ModelConfig,
    Transformer,
    count_parameters,
)

__all__ = [
    "DecoderCache",
    "Hypothesis",
    "ModelConfig",
    "Transformer",
    "beam_search",
    "count_parameters",
    "gnmt_length_penalty",
    "greedy_search",
    "label_smoothed_cross_entropy",
]
