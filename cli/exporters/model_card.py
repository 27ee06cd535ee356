"""The model card (README.md) of a Hugging Face export: what the Hub shows and a reader needs.

Languages, training data, the model's shape, how it was trained, its test scores with their
sacrebleu signatures, and how to load it. The scores are those of RUN/eval.json (`make eval`,
or `tf eval RUN --json > RUN/eval.json`) when that file scored the exported checkpoint (`tf
eval RUN` decodes RUN's best.pt, else last.pt) after it was written; export computes none of
its own (decoding the test set would make every export minutes long), and says how to get them.

What the card says of the class an export wrote (its name, its Hub tag, what CTranslate2's own
converter makes of it) is the family's (`Exported`, which each record of `cli.families`
gives); the rest asks the tokenizer (`BaseTokenizer`) and the run's config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cli.config import Config
from cli.exporters.published import published_config
from cli.inference.languages import with_languages
from cli.runs.checkpoint import CheckpointError
from cli.runs.model_dirs import resolve_checkpoint
from data.config import DataConfig, direction_name
from data.errors import counted
from data.files import shown_spec
from data.tokenizer import Tokenizer
from model.transformer import Transformer


@dataclass(frozen=True)
class Exported:
    """What the card says of the Hugging Face class an export wrote (its family's).

    Attributes:
        model_class: the transformers class ("MarianMTModel").
        hub_tag: the Hub's tag of its models (their model_type).
        converter: what CTranslate2's own converter makes of it, where it converts exactly.
        problem: why that converter would not convert this model exactly, or None.
    """

    model_class: str
    hub_tag: str
    converter: str
    problem: str | None


def run_scores(run: str) -> dict[str, Any] | None:
    """RUN/eval.json if it scored the checkpoint that `run` names, else None."""
    checkpoint, run_dir = resolve_checkpoint(run)
    scores = run_dir.path / "eval.json"
    if not scores.is_file():
        return None
    try:
        evaluated, _ = resolve_checkpoint(run_dir.path)  # what `tf eval RUN` decoded
    except CheckpointError:
        return None
    fresh = scores.stat().st_mtime >= checkpoint.stat().st_mtime
    if evaluated.resolve() != checkpoint.resolve() or not fresh:
        return None
    try:
        found = json.loads(scores.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and "bleu" in found else None


def model_card(
    model: Transformer,
    tokenizer: Tokenizer,
    config: Config,
    exported: Exported,
    step: int | None,
    scores: dict[str, Any] | None,
    imported: dict[str, Any] | None = None,
) -> str:
    """README.md for the exported directory: Hub metadata, then the card itself. `exported`:
    the family's words of its class; `imported`: the checkpoint's record of `tf import` (a
    pretrained model exported again). Paths are named as the export's config names them
    (`published_config`): by their names alone."""
    config = published_config(config)
    d = with_languages(config, tokenizer).data  # an older import's `>>xxx<<` tokens too
    tokens = d.lang_tokens()
    ways = d.translates()  # what its corpora train, not data.src_lang/tgt_lang
    langs = list(dict.fromkeys([*(lang for way in ways for lang in way), *d.languages]))
    src, tgt = example_direction(d)
    sources = list(dict.fromkeys(s for s, _ in ways)) or [src]
    title = "multilingual" if len(d.target_langs()) > 1 else f"{'/'.join(sources)}→{tgt}"
    metadata = [
        "---",
        "language:\n" + "\n".join(f"- {lang}" for lang in langs),
        "library_name: transformers",
        "pipeline_tag: translation",
        f"tags:\n- translation\n- {exported.hub_tag}\n- tf",
        "---",
    ]
    how = usage(src, own_tokenizer(tokenizer), tokens.get(tgt, ""))
    if d.lang_token_side == "target":
        how = target_side_usage(d, tokenizer, src, tgt)
    sections = [
        "\n".join(metadata),
        f"# {title} translation ({', '.join(short_languages(langs))}): a Transformer trained "
        "with `tf`",
        f"A {layer_norm(model)} Transformer encoder-decoder ({model.num_parameters():,} "
        f"parameters) {origin(config, imported)}, exported as a `{exported.model_class}`: "
        "it loads and runs as any Hugging Face translation model does.",
        "## How to use\n\n" + how + languages_note(tokens, d.lang_token_side),
        "## CTranslate2\n\n" + ctranslate2_section(exported),
        "## Data\n\n" + data_section(config),
        "## Model and training\n\n" + shape_section(model, tokenizer, config, step),
        "## Evaluation\n\n" + scores_section(scores),
    ]
    return "\n\n".join(sections) + "\n"


def layer_norm(model: Transformer) -> str:
    return "Pre-LN" if model.config.norm_first else "Post-LN"


def example_direction(d: DataConfig) -> tuple[str, str]:
    """The direction the card's example translates: the model's first, or (a many-to-many
    model, which records its languages and none of its directions) its default source
    (`data.src_lang`) into the first other language it writes."""
    ways = d.translates()
    if ways:
        return ways[0]
    src = d.src_lang if d.src_lang in d.languages else d.languages[0]
    return src, next((lang for lang in d.target_langs() if lang != src), src)


def short_languages(langs: list[str], most: int = 10) -> list[str]:
    """At most `most` languages named in a title, and how many more (NLLB-200 has 202)."""
    return langs if len(langs) <= most else [*langs[:most], f"{len(langs) - most} more"]


def origin(config: Config, imported: dict[str, Any] | None) -> str:
    """Where the weights come from, in words."""
    if imported:
        return f"imported into `tf` from `{shown_spec(imported.get('source', '?'))}`"
    if config.train.init:
        return f"fine-tuned with `tf` from `{config.train.init}`"
    return "trained from scratch with `tf`"


def own_tokenizer(tokenizer: Tokenizer) -> str | None:
    """The class of an imported tokenizer whose sources are their text and an EOS, shipped as
    its own files (OPUS-MT's MarianTokenizer); None for tf's own, whose sources carry no EOS,
    and for a kind whose sources say their language (NLLB's: `target_side_usage`)."""
    return tokenizer.hf_class if not tokenizer.languages else None


def usage(src_lang: str, own_class: str | None = None, token: str = "") -> str:
    example = "Y dijo Dios: Sea la luz." if src_lang == "es" else "..."
    example = f"{token} {example}" if token else example
    return (
        "```python\n"
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer\n\n"
        'tokenizer = AutoTokenizer.from_pretrained("THIS_DIRECTORY")\n'
        'model = AutoModelForSeq2SeqLM.from_pretrained("THIS_DIRECTORY")\n'
        f'batch = tokenizer(["{example}"], return_tensors="pt", padding=True)\n'
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))\n"
        "```\n\n"
        "`generate` without arguments is `tf translate --greedy`, token for token: one beam, "
        "and `tf`'s length limit (one number for all sentences here, `a * len(src) + b` per "
        "sentence in `tf`: the two differ only for a sentence that `tf` cuts at its limit). "
        "`num_beams=5` runs the beam search of `transformers`, whose length penalty divides by "
        "`len ** alpha` where `tf`'s divides by GNMT's `((5 + len) / 6) ** alpha`. "
        + (
            f"The tokenizer is the pretrained model's {own_class}, which ends every source "
            "with an EOS, as the model was trained."
            if own_class
            else "The tokenizer adds no token to a sentence: the model was trained on sources "
            "without an EOS."
        )
    )


def languages_note(tokens: dict[str, str], side: str = "source") -> str:
    """A multilingual model's sources start with the token of the language wanted; a model
    whose decoder writes it (`lang_token_side: target`) is given it per call."""
    if not tokens or side == "target":
        return ""
    listed = ", ".join(f"`{token}` ({lang})" for lang, token in tokens.items())
    return (
        "\n\nThe model is multilingual: start each source with the token of the language to "
        f"translate into, {listed}, as `tf translate --to LANG` does."
    )


def target_side_usage(d: DataConfig, tokenizer: Tokenizer, src: str, tgt: str) -> str:
    """How a model whose decoder writes the target language's token first is run (NLLB-200,
    M2M100, mBART-50): the source's language set on the tokenizer (its token starts the
    source), the target's forced as the decoder's first token, per call."""
    src_token, tgt_token = d.source_tokens()[src], d.lang_tokens()[tgt]
    example = "Y dijo Dios: Sea la luz." if src in ("es", "spa_Latn", "es_XX") else "..."
    fairseq = bool(tokenizer.languages)  # its HF tokenizer puts the source's code itself
    load = f'"THIS_DIRECTORY", src_lang="{src}"' if fairseq else '"THIS_DIRECTORY"'
    text = example if fairseq else f"{src_token} {example}"
    listed = ", ".join(f"`{token}`" for token in short_languages(list(d.lang_tokens().values())))
    return (
        "```python\n"
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer\n\n"
        f"tokenizer = AutoTokenizer.from_pretrained({load})\n"
        'model = AutoModelForSeq2SeqLM.from_pretrained("THIS_DIRECTORY")\n'
        f'batch = tokenizer(["{text}"], return_tensors="pt", padding=True)\n'
        f'to = tokenizer.convert_tokens_to_ids("{tgt_token}")  # the language to write\n'
        "out = model.generate(**batch, forced_bos_token_id=to)\n"
        "print(tokenizer.batch_decode(out, skip_special_tokens=True))\n"
        "```\n\n"
        + (
            f'The source says its language: `tokenizer.src_lang = "{src}"` (its code, '
            f"`{src_token}`, starts the source). "
            if fairseq
            else f"The source starts with its language's token (`{src_token}`). "
        )
        + "The decoder writes the target language's token first: "
        "`forced_bos_token_id` is that token's id, one of "
        f"{listed}. `generate(**batch, forced_bos_token_id=...)` is then `tf translate --from "
        f"{src} --to {tgt} --greedy`, token for token: one beam, and `tf`'s length limit (one "
        "number for all sentences here, `a * len(src) + b` per sentence in `tf`: the two "
        "differ only for a sentence that `tf` cuts at its limit). `num_beams=5` runs the beam "
        "search of `transformers`, whose length penalty divides by `len ** alpha`."
    )


def ctranslate2_section(exported: Exported) -> str:
    """What CTranslate2's own converter (`ct2-transformers-converter`) makes of the export."""
    if exported.problem:
        return (
            f"**Do not convert with `ct2-transformers-converter`**: {exported.problem}. "
            "`tf export RUN --to ctranslate2` writes the exact CTranslate2 model."
        )
    return exported.converter


def data_section(config: Config) -> str:
    d = config.data
    if not d.corpora():
        return "Imported into `tf` as it was: its training data is the original model's."
    corpora = d.train if isinstance(d.train, str) else d.corpora()
    if isinstance(corpora, str):
        train = f"`{corpora}`"
    else:
        train = ", ".join(
            f"`{x.corpus}` ({direction_name(d.direction(x))}, weight {x.weight:g}"
            f"{f', tag {x.tag}' if x.tag else ''})"
            for x in corpora
        )

    def sets(value, listed) -> str:
        if isinstance(value, str):
            return f"`{value}`" if value else "none"
        return ", ".join(f"`{s.corpus}` ({direction_name(d.direction(s))})" for s in listed)

    return (
        f"- training: {train}\n- development: {sets(d.dev, d.dev_sets())}\n"
        f"- test: {sets(d.test, d.test_sets())}\n\n"
        "Corpus specs as `tf` reads them: `bundled:NAME/SPLIT` is a corpus shipped with `tf`, "
        "`hf:NAME` a Hugging Face dataset, anything else local files."
    )


def shape_section(
    model: Transformer, tokenizer: Tokenizer, config: Config, step: int | None
) -> str:
    c, d, t = model.config, config.data, config.train
    updates = counted(step, "update") if step is not None else "? updates"
    layers = f"{c.n_encoder_layers} encoder and {c.n_decoder_layers} decoder layers"
    rows = [
        ("architecture", f"{layer_norm(model)} Transformer, {layers}"),
        ("width", f"d_model {c.d_model}, {c.n_heads} heads, feed-forward {c.d_ff}"),
        ("vocabulary", vocabulary_words(tokenizer, d.tokenizer_type)),
        (
            "embeddings",
            f"tied: {c.tie_embeddings}; {POSITIONS[c.positions]} up to {c.max_positions}",
        ),
        (
            "training",
            f"{updates} of {t.max_tokens} tokens "
            f"x {t.update_freq}, lr {t.lr:g} ({t.schedule}), label smoothing {t.label_smoothing:g}",
        ),
    ]
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


POSITIONS = {  # model.positions in words
    "interleaved": "sinusoidal positions",
    "halves": "sinusoidal positions",
    "fairseq": "fairseq's sinusoidal positions",
    "learned": "learned positions",
}


def vocabulary_words(tokenizer: Tokenizer, tokenizer_type: str) -> str:
    size = tokenizer.src_vocab_size
    words = tokenizer.vocabulary_words()  # an imported kind's
    return (
        f"{size} pieces, {words}"
        if words
        else f"{size} SentencePiece {tokenizer_type} pieces, joint"
    )


def scores_section(scores: dict[str, Any] | None) -> str:
    if scores is None:
        return (
            "Not evaluated at export. `tf eval RUN --src TEST.SRC --ref TEST.TGT --json > "
            "RUN/eval.json` (or `make eval`) before `tf export` puts the scores here."
        )
    decoding = scores.get("decoding") or {}
    form = "len ** alpha" if decoding.get("length_penalty_form") == "power" else "GNMT"
    how = (
        f"`tf` beam search, beam {decoding.get('beam_size')}, {form} length penalty "
        f"{decoding.get('length_penalty')}"
        if decoding.get("beam_size", 1) > 1
        else "`tf` greedy search (this export's default)"
    )
    return (
        f"On {scores.get('sentences', '?')} test sentences ({how}), detokenised output:\n\n"
        f"| metric | score | sacrebleu signature |\n|---|---|---|\n"
        f"| BLEU | {scores['bleu']:.2f} | `{scores.get('bleu_signature', '')}` |\n"
        f"| chrF | {scores['chrf']:.2f} | `{scores.get('chrf_signature', '')}` |"
    )
