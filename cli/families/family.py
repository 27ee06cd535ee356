"""The record of a model family: everything `tf` knows of one family of Hugging Face
translation models, each fact stated once, as CTranslate2's converters register one loader per
model type.

A record names transformers' classes (config, model, tokenizer), the `ModelConfig` switches
and weight-name table of `model/` (the family's module: `model.marian`, `model.m2m100`,
`model.mbart`), what its import downloads and how it reads the files (`plan`, over the generic
machinery of `cli.importers`), how its class is exported (`export`, over `cli.exporters`), and
what a model card says of CTranslate2's converter. The tokenizer's own facts (its files, its
special ids, NLLB's language codes) stay in `data/`, which the records refer to.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cli.config import Config
from cli.exporters.model_card import Exported
from cli.importers.plan import Plan
from data.tokenizer_base import BaseTokenizer
from model.transformer import Transformer


@dataclass(frozen=True, eq=False)  # a record is itself: compared by identity
class Family:
    """A family of Hugging Face translation models `tf import` reads and `tf export --to
    huggingface` writes. A new family is a new record (a module of `cli/families/`), its line
    in `cli.families.registry.FAMILIES`, and its tests.

    Attributes:
        title: as messages name it ("Marian (OPUS-MT)").
        model_types: config.json's `model_type` of its models, which `tf import` dispatches
            on; the first is the Hub's tag of an export.
        config_class: transformers' config class: its defaults fill config.json's silences,
            and an export's config.json is one.
        model_class: the transformers class an export writes.
        switches: the `ModelConfig` switches every model of the family has (`model/`'s
            LAYOUT); `switches["norm_first"]` and `["positions"]` pick the family an export
            takes (`cli.families.registry.exporting_family`).
        position_offset: the position table's first row, of the pad id (`model/`'s rule).
        names: the weight-name table (`model/`): our weights under the family's names.
        tokenizer_classes: the transformers classes of the family's own tokenizer files
            (`BaseTokenizer.hf_class`).
        files: what a hub download fetches besides config.json, the weights and the generation
            settings (`cli.importers.source.COMMON_FILES`): its tokenizer's files.
        plan: (directory, config.json as read, the source as given) -> the import's `Plan`.
        export: (model, tokenizer, config, out) -> `out` (which exists) written as the
            family's class with its tokenizer: what `AutoModelForSeq2SeqLM` and
            `AutoTokenizer` load (the model card is the caller's).
        converter: what CTranslate2's own converter makes of an export it converts exactly
            (the card's words).
        converter_problem: (model, tokenizer) -> why that converter would not convert this
            model's export exactly, or None.
    """

    title: str
    model_types: tuple[str, ...]
    config_class: str
    model_class: str
    switches: dict[str, Any]
    position_offset: Callable[[int], int]
    names: Callable[[Transformer], dict[str, torch.Tensor]]
    tokenizer_classes: tuple[str, ...]
    files: tuple[str, ...]
    plan: Callable[[Path, dict[str, Any], str], Plan]
    export: Callable[[Transformer, BaseTokenizer, Config, Path], None]
    converter: str
    converter_problem: Callable[[Transformer, BaseTokenizer], str | None]

    def exported(self, model: Transformer, tokenizer: BaseTokenizer) -> Exported:
        """What the model card says of this family's export of `model`."""
        problem = self.converter_problem(model, tokenizer)
        return Exported(self.model_class, self.model_types[0], self.converter, problem)
