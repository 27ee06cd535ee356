"""A `tf` model of NLLB-200's, M2M100's or mBART-50's layout as the Hugging Face class that runs
it, loaded as any translation model is (`AutoTokenizer`, `AutoModelForSeq2SeqLM`, `generate`).

Which class is the model's switches' (`model/m2m100.py`, `model/mbart.py` list them):

- `M2M100ForConditionalGeneration` (NLLB-200 and M2M100): Pre-LN (`norm_first`) with fairseq's
  sinusoids (`positions: fairseq`) counted from pad_token_id + 1 (`position_offset`), no norm
  on the embeddings, no bias on the logits;
- `MBartForConditionalGeneration` (mBART-50): Pre-LN with learned positions from row 2
  (`positions: learned`, `position_offset: 2`) and a norm on the embeddings
  (`layernorm_embedding`); `final_logits_bias` holds `model.output_bias` (zeros without one);
- `MarianMTModel` (`cli.exporters.marian`): Post-LN with the paper's sinusoids;

every one with one vocabulary and tied embeddings (`tie_embeddings: all`). A model that is none
of them (fairseq positions in a Post-LN model, a Pre-LN one with the paper's sinusoids...) is
refused in one line: no class of `transformers` computes what it computes.

The weights move by the family's name table (`m2m100_weights`, `mbart_weights`): its whole
state dict, loaded strictly into the class built on the meta device (no random initialisation
of a 600M-parameter model, no second copy of it). `config.json` is the class's: the widths,
the activation, `scale_embedding`, `max_position_embeddings`, the special ids, the decoder's
start (`decoder_start_token_id`: EOS, 2, for all three families), the tokenizer's class (which
CTranslate2's converter reads: mBART-50's decoder starts from EOS, mBART-25's from the code).
`generation_config.json` is tf's greedy search and length limit, as Marian's export writes it
(`cli.exporters.marian.generation_config`), with no `forced_bos_token_id`: the target language
is the caller's, `generate(**batch, forced_bos_token_id=tokenizer.convert_tokens_to_ids(code))`
per call, as the published models are run. The tokenizer files are the run's own, as the
original model had them (an NLLB/M2M100/mBART-50 tokenizer's `model_paths`; a
`tokenizer_config.json` saying which class reads them where the run keeps none); a tf
tokenizer's become a fast tokenizer that appends nothing (`cli.exporters.hf_tokenizer`).
Beside them, the run's config (`tf_config.yaml`), for `tf import` of the directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from cli.config import Config
from cli.exporters.hf_tokenizer import write_tokenizer
from cli.exporters.marian import generation_config, layer_settings
from cli.exporters.published import copy_tokenizer_models, save_published_config
from data.errors import InputError
from data.fairseq import HF_CONFIG, MASK, NLLB, FairseqTokenizer
from data.fairseq import M2M100 as M2M100_TOKENIZER
from data.tokenizer import Tokenizer
from model.m2m100 import m2m100_weights
from model.mbart import mbart_weights
from model.transformer import ModelConfig, Transformer


@dataclass(frozen=True)
class Family:
    """A Hugging Face class that runs a Pre-LN model of one kind of positions."""

    model_class: str  # transformers' class
    config_class: str
    positions: str  # the `model.positions` it takes
    layernorm_embedding: bool  # whether its embeddings end in a norm
    logits_bias: bool  # whether it has `final_logits_bias`
    # config.json's keys beyond the class's own, as the published models' carry them
    extra: tuple[tuple[str, object], ...] = ()


M2M100 = Family("M2M100ForConditionalGeneration", "M2M100Config", "fairseq", False, False)
# mBART-50's config.json keeps fairseq's names of its layout, which CTranslate2's mBART loader
# reads (`normalize_before`: Pre-LN; `normalize_embedding`: the embeddings' norm).
MBART_LAYOUT = (("normalize_before", True), ("normalize_embedding", True))
MBART = Family("MBartForConditionalGeneration", "MBartConfig", "learned", True, True, MBART_LAYOUT)
FAMILIES = (M2M100, MBART)
MBART_OFFSET = 2  # transformers' MBartLearnedPositionalEmbedding.offset, whatever the pad


def huggingface_family(c: ModelConfig) -> Family | None:
    """The class `tf export --to huggingface` writes for a model of `c`: M2M100's or mBART's
    for a Pre-LN model of their positions, None for a Post-LN one (Marian's, which
    `cli.exporters.marian.check_exportable` checks).

    Raises:
        InputError: a model no Hugging Face class runs, as one line.
    """
    family = next((f for f in FAMILIES if f.positions == c.positions), None)
    if not c.norm_first and family is None:
        return None
    if family is None:
        raise InputError(
            f"no Hugging Face class runs a Pre-LN model with model.positions {c.positions}: "
            "M2M100's takes fairseq, mBART's learned (Marian's sinusoids are Post-LN)"
        )
    if not c.norm_first:
        raise InputError(
            f"no Hugging Face class runs a Post-LN model with model.positions {c.positions}: "
            f"{family.model_class} is Pre-LN (model.norm_first), Marian takes the paper's "
            "sinusoids"
        )
    return family


def check_exportable(family: Family, c: ModelConfig, tokenizer: Tokenizer) -> None:
    """What `family`'s class cannot hold, as one line naming the settings."""
    pad = tokenizer.pad_id
    offset = MBART_OFFSET if family is MBART else pad + 1
    wanted = {
        "position_offset": offset,  # M2M100 counts positions from pad_token_id + 1
        "layernorm_embedding": family.layernorm_embedding,
        "tie_embeddings": "all",  # one `shared` matrix: both embeddings and the output layer
        "norm_eps": 1e-5,
    }
    if not family.logits_bias:
        wanted["output_bias"] = False
    wrong = [f"model.{k} {getattr(c, k)!r}" for k, v in wanted.items() if getattr(c, k) != v]
    asked = [f"model.{k} {v!r}" for k, v in wanted.items()] + ["heads that span d_model"]
    if c.d_head and c.d_head * c.n_heads != c.d_model:
        wrong.append(f"model.d_head {c.d_head} (pruned heads)")
    if family is M2M100:
        # M2M100 numbers the decoder's positions by its tokens other than pad: from a pad start
        # every position one below tf's (whose fairseq sinusoids skip pad's own only).
        asked.append("a decoder that starts from another token than pad")
        if tokenizer.decoder_start_id(c.decoder_start) == pad:
            wrong.append(f"model.decoder_start {c.decoder_start!r} (pad)")
    if wrong:
        raise InputError(
            f"{family.model_class} takes {', '.join(asked)}: this model has {', '.join(wrong)}"
        )


def export_m2m100(
    family: Family, model: Transformer, tokenizer: Tokenizer, config: Config, out: Path
) -> None:
    """Write `model` as a `family` directory `out` (which exists), with its tokenizer: what
    `AutoModelForSeq2SeqLM` and `AutoTokenizer` load (the model card is the caller's)."""
    import transformers
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # "Writing model shards": one shard, no news
    c = model.config
    check_exportable(family, c, tokenizer)
    special = special_ids(model, tokenizer)
    settings = hf_settings(c, model.generator.weight.size(0), special, tokenizer)
    settings.update(family.extra)
    hf_config = getattr(transformers, family.config_class)(**settings)
    with torch.device("meta"):  # no weights of its own: ours are assigned
        hf = getattr(transformers, family.model_class)(hf_config)
    weights = mbart_weights(model) if family is MBART else m2m100_weights(model)
    hf.load_state_dict(weights, strict=True, assign=True)
    hf.tie_weights()  # `shared`, both embeddings and `lm_head`: one matrix, saved once
    hf.generation_config = generation_config(special, config.decode, c)
    # (M2M100's sinusoids stay on the meta device: a buffer computed from the config, never
    # saved, which `from_pretrained` computes again.)
    hf.save_pretrained(out, safe_serialization=True)
    write_tokenizer_files(tokenizer, out, config)
    save_published_config(config, out)


def special_ids(model: Transformer, tokenizer: Tokenizer) -> dict[str, int]:
    """The special ids of the configs: the tokenizer's (fairseq's <s> <pad> </s> at 0-2 in all
    three families' tokenizers), the EOS forced at the length limit as tf's search does, and
    the decoder's start (`model.decoder_start`)."""
    bos = tokenizer.eos_id if tokenizer.bos_id is None else tokenizer.bos_id
    return dict(
        pad_token_id=tokenizer.pad_id,
        bos_token_id=bos,
        eos_token_id=tokenizer.eos_id,
        forced_eos_token_id=tokenizer.eos_id,
        decoder_start_token_id=tokenizer.decoder_start_id(model.config.decoder_start),
    )


def hf_settings(c: ModelConfig, vocab_size: int, special: dict[str, int], tokenizer) -> dict:
    """config.json's settings for a model of `c` with `vocab_size` rows (the embeddings', which
    may number more than the tokenizer's pieces: NLLB-200's 256,206 against 256,204)."""
    ids = {k: v for k, v in special.items() if k != "forced_eos_token_id"}  # generation's
    return dict(
        vocab_size=vocab_size,
        **layer_settings(c),
        scale_embedding=c.scale_embedding,
        encoder_layerdrop=c.encoder_layerdrop,
        decoder_layerdrop=c.decoder_layerdrop,
        tie_word_embeddings=True,
        tokenizer_class=tokenizer_class(tokenizer),
        **ids,
    )


def tokenizer_class(tokenizer: Tokenizer) -> str:
    """The transformers class that reads the exported tokenizer files."""
    if isinstance(tokenizer, FairseqTokenizer):
        return tokenizer.family.classes[0]
    return "PreTrainedTokenizerFast"


def write_tokenizer_files(tokenizer: Tokenizer, out: Path, config: Config) -> None:
    """The run's tokenizer files as the original model had them, and a tokenizer_config.json
    where the run keeps none; a tf tokenizer as a fast tokenizer (and its SentencePiece
    model(s), which `tf import` of the export reads)."""
    if not isinstance(tokenizer, FairseqTokenizer):
        write_tokenizer(tokenizer, out, config.model.max_positions)
        copy_tokenizer_models(tokenizer, out)
        return
    copy_tokenizer_models(tokenizer, out)
    if not any(path.name == HF_CONFIG for path in tokenizer.model_paths()):
        settings = fairseq_tokenizer_config(tokenizer, config.model.max_positions)
        (out / HF_CONFIG).write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")


def fairseq_tokenizer_config(tokenizer: FairseqTokenizer, max_positions: int) -> dict:
    """tokenizer_config.json for an NLLB-200, M2M100 or mBART-50 tokenizer's files: its class
    and the settings tf read of the original's (`FairseqSettings`), its special tokens."""
    s = tokenizer.settings
    settings = {
        "tokenizer_class": tokenizer.family.classes[0],
        "src_lang": s.src_lang,
        "tgt_lang": None,
        "clean_up_tokenization_spaces": s.clean_up_tokenization_spaces,
        "model_max_length": max_positions,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "sep_token": "</s>",
        "cls_token": "<s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "additional_special_tokens": list(s.codes),
    }
    if tokenizer.family is NLLB:
        settings["legacy_behaviour"] = s.legacy_behaviour
    lists = [name for name, codes in tokenizer.family.code_lists.items() if codes == s.codes]
    if tokenizer.family is M2M100_TOKENIZER and lists:  # M2M100's list or WMT21's
        settings["language_codes"] = lists[0]
    if MASK in tokenizer.tgt_vocabulary():
        settings["mask_token"] = MASK
    return settings
