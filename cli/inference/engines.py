"""What `tf translate` and `tf eval` decode with: the run's PyTorch model (fp32, or its linear
layers in int8 with a scale per row of activations, `model.int8`), or an exported CTranslate2
directory, behind one streaming interface.

Each engine yields, for every input line in order, the source ids it translated and the
hypotheses (ids, best first, scored as `model.search.Hypothesis` says), so output formatting and
scoring never depend on the engine. Every decode setting is checked against the engine and the
device when the engine is loaded: one that cannot work is a one-line error before the first
sentence (or, in `tf serve`, the first request), not a failure of every search.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch

from cli.config import TF_CONFIG, Config, DecodeConfig, load_config, with_overrides
from cli.device import autocast_dtype, bound_decoding_kernels, engine_precision
from cli.inference.decoding import (
    Grouping,
    Rows,
    chunks,
    encode_sources,
    is_greedy,
    length_penalty,
    translate_ids,
)
from cli.inference.languages import (
    check_languages,
    default_target,
    needs_to,
    short_list,
    with_language,
    with_languages,
)
from cli.inference.requests import Guide, Request, encode_guide
from cli.runs.checkpoint import CheckpointError
from cli.runs.model_dirs import is_ctranslate2_dir
from cli.runs.models import load_for_inference
from data.config import DataConfig, direction_of
from data.errors import InputError
from data.tokenizer import Tokenizer
from model.ensemble import Ensemble
from model.int8 import quantize_linears
from model.packed import pack_linears
from model.search import Hypothesis, LengthPenalty
from model.transformer import Transformer

log = logging.getLogger(__name__)

Results = Iterator[tuple[list[int], list[Hypothesis]]]
Guides = list[Guide | None] | None  # one per source (a prefix, constraints), or None for none
# (source ids, decode settings, guides) -> each source's hypotheses, best first, in input order
Search = Callable[[list[list[int]], DecodeConfig, Guides], list[list[Hypothesis]]]
# decode.precision -> CTranslate2's compute_type. auto: the type the directory was exported in
# (`tf export --quantization`), as CTranslate2's "default"; fp32 gives tf's fp32 numbers.
CT2_COMPUTE_TYPES = {"auto": "default", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass
class Engine:
    tokenizer: Tokenizer
    config: Config  # the run's, with the command line's decode overrides
    search: Search
    model: Transformer | Ensemble | None = None  # the PyTorch model(s), when that is the engine
    to: str = ""  # the output language --to named (lines that name none); "": the default
    frm: str = ""  # the source language (--from), unless a line says
    # The engine's own rules of decode settings (CTranslate2's: `check_ct2_decode`), checked
    # at load and on a `tf serve` request's settings alike (`check_decode`); None: tf's own.
    rules: Callable[[DecodeConfig], None] | None = None
    # What searches: tf's own search over `model` ("pytorch"), or CTranslate2's.
    kind: Literal["pytorch", "ctranslate2"] = "pytorch"
    int8: bool = False  # the PyTorch model's linear layers in int8 (`model.int8`)
    # {language: its token} of the languages the model writes where a token says which: a
    # multilingual model's; every model's whose decoder writes it first (lang_token_side
    # target). {} for a one-way model of source-side tokens. From the config and the
    # tokenizer, always (`replace` recomputes it); `sources` likewise for the languages read.
    languages: dict[str, str] = field(init=False, default_factory=dict)
    sources: dict[str, str] = field(init=False, default_factory=dict)
    # The language written where nothing names one: the model's one, or its recorded default
    # (`cli.inference.languages.default_target`); "": none, --to must say.
    default_to: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.config = with_languages(self.config, self.tokenizer)
        self.languages = self.config.data.lang_tokens()
        self.sources = self.config.data.source_tokens()
        self.default_to = default_target(self.config.data)

    @property
    def label(self) -> str:
        """What the engine is called (`tf serve`'s /health): its kind, "pytorch-int8" in int8."""
        return f"{self.kind}-int8" if self.int8 else self.kind

    @property
    def ensemble(self) -> bool:
        """Whether several models decode as one (`model.ensemble`)."""
        return isinstance(self.model, Ensemble)

    @property
    def constraints(self) -> bool:
        """Whether its search keeps lexical constraints (tf's own; CTranslate2 has none)."""
        return self.kind == "pytorch"

    @property
    def attention_heatmaps(self) -> bool:
        """Whether it can draw a translation's cross-attention (`--attention`): one PyTorch
        model with its float weights (not int8, not an ensemble)."""
        return self.kind == "pytorch" and not self.ensemble and not self.int8

    @property
    def own_threads(self) -> bool:
        """Whether it shares the cores out itself (CTranslate2's thread pool), so that `tf
        serve` runs one search worker (`cli.device.search_workers`)."""
        return self.kind == "ctranslate2"

    @property
    def parameters(self) -> int:
        """The model's parameters; 0 where the engine does not say (CTranslate2)."""
        return self.model.num_parameters() if self.kind == "pytorch" else 0

    @property
    def multilingual(self) -> bool:
        """Whether the model writes several languages, chosen by --to, a line's "to" or token."""
        return len(self.languages) > 1

    @property
    def target_side(self) -> bool:
        """Whether the decoder writes the target language's token first (NLLB, M2M100...)."""
        return self.config.data.lang_token_side == "target"

    @property
    def output_language(self) -> str:
        """What a line that names no language is written in: --to, else the model's default;
        "" where the model records none."""
        return self.to or self.default_to

    def check_decode(self, decode: DecodeConfig) -> None:
        """Decode settings this engine can search with: the one check of the settings a
        command line asks for (at load) and of those a `tf serve` request's "beam" makes.

        Raises:
            InputError: a setting the engine cannot follow (CTranslate2's beam rules).
        """
        if self.rules is not None:
            self.rules(decode)

    def choose(self, to: str, where: str = "--to", frm: str = "") -> None:
        """Translate into `to` (a multilingual model's lines that name no language; "": the
        model's default, said once on stderr), from `frm` (lines that name none, of a model
        whose source says its language).

        Raises:
            InputError: a language the model lacks (`check_languages`); a --from that is the
                default output language, which would translate a language into itself.
        """
        check_languages(to, frm, self.languages, self.config, (where, "--from"))
        if frm and not to and frm == self.default_to and self.multilingual:
            raise InputError(
                f"--from {frm} is also the model's default output language (data.tgt_lang): "
                f"choose the output language with --to, one of {short_list(self.languages)}"
            )
        self.to, self.frm = to, frm
        self.say_defaults()

    def say_defaults(self) -> None:
        """Say on stderr, once, a recorded default that decides what is written or read where
        a model has a choice (a many-to-many import's `tgt_lang`, `src_lang`)."""
        if self.multilingual and not self.to and self.default_to:
            log.info(
                "translating into %s, the model's default output language (data.tgt_lang); "
                "--to (or a line's to) chooses another",
                self.default_to,
            )
        into = self.output_language
        if self.target_side and into and not self.frm:
            source = self.default_source(into)
            if source and len(self.config.data.sources_into(into)) > 1:
                log.info(
                    "reading sources as %s, the model's default source language "
                    "(data.src_lang); --from (or a line's from) names another",
                    source,
                )

    def direction(self, command: str) -> tuple[str, str]:
        """(source, target) language of what `command` makes (a corpus's file names): into
        the output language (--to, or the model's default), from --from, or the language the
        model reads into that one (`default_source`; "src" where it reads several).

        Raises:
            InputError: a multilingual model without a default, and no --to, naming its
                languages; or a source language the same as the target (the corpus's two
                files would be one).
        """
        target = self.output_language
        if not target:
            raise InputError(needs_to(command, self.languages, line=False))
        source = self.source_language()
        if source == "src" and self.target_side:  # its sources must say their language
            raise InputError(
                f"{command}: the model reads {short_list(dict.fromkeys(self.source_langs()))} "
                f"into {target}: name the source's language with --from"
            )
        if source == target:
            raise InputError(
                f"{command}: source and target language are both {source!r}: the pairs' two "
                f"files would be one, train.{source}"
            )
        return source, target

    def target(self, to: str = "", where: str = "--to") -> str:
        """The language a line is written into: `to` (its own), --to, or the model's default.

        Raises:
            InputError: none of them (a multilingual model that records no default), naming
                `where` and the languages to choose from.
        """
        lang = to or self.output_language
        if not lang:
            raise InputError(needs_to(where, self.languages, typed=not self.target_side))
        return lang

    def source_language(self) -> str:
        """The language a line that names none is read in, into the output language: --from,
        the model's one or its recorded default (`default_source`), else "src" (it reads
        several and records none)."""
        return self.frm or self.default_source() or self.reads()

    def reads(self) -> str:
        """The source language of the direction chosen (--to, or a one-way model's own):
        "src" where the model reads several into it (a many-to-one model)."""
        sources = self.source_langs()
        return sources[0] if len(sources) == 1 else "src"

    def source_langs(self) -> list[str]:
        """The languages the model reads into the output language (--to, or the model's
        default); a multilingual model's without either: every language it reads."""
        d = self.config.data
        if self.frm:
            return [self.frm]
        if not self.output_language:
            return d.source_langs()
        return d.sources_into(self.output_language)

    def source_text(self, line: str | Request, where: str, to: str = "", frm: str = "") -> str:
        """A line as the model reads it: with the token of the language it asks to be written
        in (a multilingual model's: its own "to", else the one it starts with, else `to`'s,
        a default the caller has checked with `check_languages`, or the engine's), or, where
        the source says its own language (`lang_token_side: target`), that language's token
        (its own "from", the one it starts with, `frm`, --from, or the model's one into its
        target). Its "to" and "from" are checked as --to and --from are (`check_languages`)."""
        request = line if isinstance(line, Request) else Request(line)
        check_languages(request.to, request.frm, self.languages, self.config, (where, where))
        if not self.target_side:
            lang = request.to or to or self.output_language
            return with_language(request.text, lang, self.languages, where, request.to)
        target = self.target(request.to or to, where)
        named = request.frm or frm or self.frm
        self.check_not_into_itself(named, target, request.to or to, where)
        default = named or self.default_source(target)
        return with_language(request.text, default, self.sources, where, request.frm, "from")

    def check_not_into_itself(self, source: str, target: str, asked: str, where: str) -> None:
        """A line in the language the model would write by default is refused, not copied
        into itself: its "from" (or --from) names the default output language, and nothing
        named the output language."""
        if source and source == target and not (asked or self.to) and self.multilingual:
            raise InputError(
                f'{where}: "from" {source} is also the model\'s default output language: '
                f'choose the output language with --to (or "to")'
            )

    def default_source(self, to: str = "") -> str:
        """The source language a line that names none is read in: the one the model reads into
        its target (`to`, else the output language), or (a many-to-many model's: NLLB's 202)
        the one it records as its default (`data.src_lang`, tokenizer_config.json's `src_lang`
        at import); else none ("" too where no target is chosen)."""
        d = self.config.data
        target = to or self.output_language
        if not target:
            return ""
        sources = d.sources_into(target)
        if len(sources) == 1:
            return sources[0]
        return d.src_lang if d.languages and d.src_lang in sources else ""

    def stream(
        self,
        lines: Iterable[str | Request],
        source: str,
        group: Grouping = chunks,
        first: int = 1,
    ) -> Results:
        """(source ids as translated, hypotheses) for each input line (its text, or a Request
        with a prefix and constraints), in order, group by group (`chunks`, or
        `as_they_arrive` for interactive input), with the config's settings; the ids are
        encoded once, here (`--attention` reuses them), and a line over the model's limit is
        translated in parts and joined (`encode`), never cut. Messages call the lines
        `source:N`, the first N `first`. A line that asked for what no translation can hold is
        an InputError naming it (`check_found`)."""
        for chunk in group(lines):
            where = [f"{source}:{first + n}" for n in range(len(chunk))]
            texts = [self.source_text(r, w) for r, w in zip(chunk, where)]
            rows = self.encode(texts, [self.reading(r) for r in chunk], source, first)
            guides = self.guides(chunk, rows, where, self.config.decode)
            found = self.search(rows, self.config.decode, guides)
            self.check_rows(rows, found, guides, where, self.config.decode)
            yield from zip(rows.line_ids(), rows.joined(found, self.tokenizer))
            first += len(chunk)

    def encode(self, texts: list[str], languages: list[str], source: str, first: int) -> Rows:
        """The rows to search for lines as the model reads them (`source_text`): one a line,
        or, a line over the model's limit, one a part (`encode_sources`, which fits it by the
        sentence splitter of its language, `reading`); `Rows.joined` makes the lines' results."""
        max_src = self.config.model.max_positions
        return encode_sources(self.tokenizer, texts, max_src, source, first, languages)

    def reading(self, line: str | Request, frm: str = "", to: str = "") -> str:
        """The language a line's text is in, for its sentence splitter: its own "from", `frm`
        (a request body's), --from, the one the model reads into its target, else the run's
        source language (`data.src_lang`)."""
        request = line if isinstance(line, Request) else Request(line)
        named = request.frm or frm or self.frm
        return named or self.default_source(request.to or to) or self.config.data.src_lang

    def check_rows(
        self, rows: Rows, found: list, guides: Guides, where: list[str], decode: DecodeConfig
    ) -> None:
        """Every row's search found a translation (`check_found`), a part named by its line."""
        settings = replace(self.config, decode=decode)
        for row, (n, ids, hyps) in enumerate(zip(rows.owners(), rows, found)):
            check_found(hyps, ids, guides[row] if guides else None, settings, where[n])

    def guides(
        self, chunk: list, rows: Rows, where: list[str], decode: DecodeConfig, to: str = ""
    ) -> Guides:
        """The guides of the rows of `chunk`'s lines (`guide`), each line's checked; None when
        no line has one. A line translated in parts has its prefix on its first part, and no
        constraints (which part would have to hold them?: refused, naming the line)."""
        asks = any(isinstance(r, Request) and (r.prefix or r.constraints) for r in chunk)
        if not asks and not self.target_side:
            return None
        out = []
        for n, ids, first in zip(rows.owners(), rows, rows.firsts()):
            request = chunk[n] if isinstance(chunk[n], Request) else Request(chunk[n])
            if n in rows.cuts:
                self.check_in_parts(request, where[n])
                request = request if first else replace(request, prefix="")
            out.append(self.guide(request, ids, where[n], decode, to))
        return out

    def check_in_parts(self, request: Request, where: str) -> None:
        """A line over the model's limit, translated in parts, asks nothing a part cannot do.

        Raises:
            InputError: constraints, naming the line: no one part is the translation that
                must hold them, and each part holding them would repeat them.
        """
        if request.constraints:
            raise InputError(
                f"{where}: constraints on a line over the model's limit of "
                f"{self.config.model.max_positions} pieces, which is translated in parts: "
                "split it into sentences, each with its own constraints"
            )

    def guide(
        self, line: str | Request, ids: list[int], where: str, decode: DecodeConfig, to: str = ""
    ) -> Guide | None:
        """What the search of one line is made to do besides translating: write the target
        language's token first (`lang_token_side: target`: certain, as transformers'
        `forced_bos_token_id`), then the request's prefix, with its constraints
        (`encode_guide`, checked); None for nothing. An empty line gets none: it is not
        searched (its translation is empty)."""
        request = line if isinstance(line, Request) else Request(line)
        if request.constraints and decode.sampling:
            raise InputError(f"{where}: constraints need beam search; sampling cannot keep them")
        forced = self.target_side and bool(ids)  # the language token takes one place
        limit = length_limit(len(ids), replace(self.config, decode=decode)) - forced
        guide = encode_guide(self.tokenizer, request, len(ids), limit, where, self.constraints)
        if not forced:
            return guide
        token = self.languages[self.target(request.to or to, where)]
        return replace(guide or Guide(), forced=tuple(self.tokenizer.tgt_piece_ids([token])))


def check_found(
    hyps: list[Hypothesis], src_ids: list[int], guide: Guide | None, config: Config, where: str
) -> None:
    """A translation came out of the search for a line, or an InputError naming it. The search
    has none (nothing, or a dead end scored -inf) when the line's constraints can no longer be
    met (a phrase repeated under `decode.no_repeat_ngram_size`, say) or, rarely, when the rules
    alone leave no way to end (`decode.min_len` against the n-gram ban): the request's fault,
    never a translation to print empty."""
    if hyps and hyps[0].log_prob != float("-inf"):
        return
    dec = config.decode
    rules = f"within its length limit of {length_limit(len(src_ids), config)} pieces"
    if dec.no_repeat_ngram_size:
        rules += f" without repeating a {dec.no_repeat_ngram_size}-gram (no_repeat_ngram_size)"
    if guide is not None and guide.constraints:
        raise InputError(f"{where}: no translation can hold this line's constraints {rules}")
    raise InputError(f"{where}: the search found no translation {rules}, min_len {dec.min_len}")


def load_engine(
    runs: str | list[str],
    device: torch.device,
    overrides: list[str],
    int8: bool = False,
    to: str = "",
    frm: str = "",
) -> Engine:
    """The engine for RUN (a run directory or checkpoint) or for an exported CTranslate2 DIR,
    its decode settings checked against it and `device` (see the module docstring). Several
    runs decode as an ensemble (`model.ensemble`), with the first run's settings. `to`: the
    output language of a multilingual model, `frm` the source's of a model that reads it
    (`cli.inference.languages`).

    Raises:
        InputError: a setting this engine cannot run on this device (fp16 on a CPU, a patience
            of 0 for CTranslate2, a precision CTranslate2 lacks there, --int8 off the CPU...);
            an ensemble with a CTranslate2 directory, or of runs with different tokenizers;
            a `to` the model does not translate into.
    """
    runs = [runs] if isinstance(runs, str) else list(runs)
    exported = [r for r in runs if is_ctranslate2_dir(r)]
    if exported and len(runs) > 1:
        raise InputError(
            f"{exported[0]}: CTranslate2 decodes one model; give the runs themselves to ensemble"
        )
    if exported:
        if int8:
            raise InputError(f"{runs[0]}: --int8 is for PyTorch models; export with --quantization")
        engine = ctranslate2_engine(Path(runs[0]), device, overrides)
        engine.choose(to, frm=frm)
        return engine
    model, tokenizer, config = load_for_inference(runs[0], device)
    models = [model]
    for other in runs[1:]:
        member, member_tokenizer, member_config = load_for_inference(other, device)
        check_member(other, member_tokenizer, member_config, runs[0], tokenizer, config)
        models.append(member)
    config = with_overrides(config, overrides)
    if int8:  # its layers take fp32 activations (quantized on the fly), never autocast's bf16
        config = replace(config, decode=replace(config.decode, precision="fp32"))
    precision = engine_precision(config.decode.precision, device)
    config = replace(config, decode=replace(config.decode, precision=precision))
    dtype = autocast_dtype(precision, device, "decode.precision")
    models = computing_weights(models, device, dtype, int8)
    if len(models) > 1:
        model = Ensemble(models)
        config = replace(config, model=model.config)  # the shortest position table
    else:
        model = models[0]

    def search(src_ids: list[list[int]], decode: DecodeConfig, guides: Guides = None):
        return translate_ids(model, tokenizer, src_ids, decode, device, guides=guides)

    engine = Engine(tokenizer, config, search, model, int8=int8)
    engine.choose(to, frm=frm)
    return engine


def check_member(
    run: str,
    tokenizer: Tokenizer,
    config: Config,
    first: str,
    first_tokenizer: Tokenizer,
    first_config: Config,
) -> None:
    """An ensemble's member `run` decodes with the first run `first`: one tokenizer, the same
    directions (one tokenizer serves es->en and en->es alike, and the mean of two opposite
    models' log-probabilities is garbage with exit 0; `reach`: a many-to-many model and its
    fine-tunes translate alike) and the same language tokens, put in the same place."""
    if tokenizer.digest() != first_tokenizer.digest():
        raise InputError(
            f"{run}: its tokenizer is not {first}'s; an ensemble needs one tokenizer "
            f"(train the others with --set data.tokenizer={first}/tokenizer)"
        )
    ours = with_languages(first_config, first_tokenizer).data
    theirs = with_languages(config, tokenizer).data
    if reach(theirs) != reach(ours):
        raise InputError(
            f"{run}: translates {described(theirs)}, {first} {described(ours)}; an ensemble's "
            "members translate the same directions (the mean of opposite models' scores is no "
            "model's)"
        )
    tokens = (theirs.lang_tokens(), theirs.source_tokens())
    if tokens != (ours.lang_tokens(), ours.source_tokens()):
        raise InputError(
            f"{run}: its language tokens (or where they go, data.lang_token_side) are not "
            f"{first}'s; an ensemble's members share their languages and their tokens"
        )
    start, first_start = config.model.decoder_start, first_config.model.decoder_start
    if start != first_start:  # every step feeds all members the same tokens
        raise InputError(
            f"{run}: its decoder starts from {start}, {first}'s from {first_start} "
            "(model.decoder_start); an ensemble's members start alike"
        )


def reach(d: DataConfig) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    """What a model translates, as ensemble members must share it: its languages (a
    many-to-many model's, any into any) and its directions besides those. A fine-tune of an
    NLLB-200 import on spa_Latn->eng_Latn translates what the import does: its corpus's
    direction is one of any into any."""
    langs = frozenset(d.languages)
    ways = [(src, tgt) for src, tgt in d.translates() if not {src, tgt} <= langs]
    return langs, frozenset(ways)


def described(d: DataConfig) -> str:
    """What a model translates, for a message: its directions and, a many-to-many model's,
    its languages any into any."""
    langs, ways = reach(d)
    parts = [", ".join(direction_of(*way) for way in d.translates() if way in ways)]
    if langs:
        parts.append(f"any of {len(langs)} languages into any")
    return " and ".join(p for p in parts if p) or "nothing"


def computing_weights(
    models: list[Transformer], device: torch.device, dtype: torch.dtype | None, int8: bool
) -> list[Transformer]:
    """The models with their weights as the engine computes with them: in int8
    (`quantize_int8`), or packed once for oneDNN on a CPU (float32, bf16). In bf16 and int8
    the kernels oneDNN keeps are bounded first (`bound_decoding_kernels`: before its first)."""
    if int8 or dtype is not None:
        bound_decoding_kernels()
    if int8:
        return [quantize_int8(m, device) for m in models]
    if dtype in (None, torch.bfloat16):
        for m in models:
            pack_linears(m, dtype or torch.float32)
    return models


def quantize_int8(model: Transformer, device: torch.device) -> Transformer:
    """The model with every linear layer (attention projections, feed-forward, generator) in
    int8 (`model.int8`): weights in int8, each row of activations quantized on the fly by its
    own scale, so that a sentence's translation never depends on its batch. CPU only."""
    if device.type != "cpu":
        raise InputError("--int8 runs on the CPU only (use --device cpu)")
    return quantize_linears(model)


def ctranslate2_engine(directory: Path, device: torch.device, overrides: list[str]) -> Engine:
    """A CTranslate2 Translator over DIR, with DIR's SentencePiece model(s) and decode settings."""
    try:
        import ctranslate2
    except ImportError:
        raise InputError("CTranslate2 is needed to run it: pip install 'tf[export]'") from None
    tokenizer = Tokenizer.load(directory)
    config = with_overrides(load_config(directory / TF_CONFIG), overrides)
    check_ct2_decode(config.decode)  # before CTranslate2 loads (`Engine.check_decode` later)
    try:
        translator = ctranslate2.Translator(
            str(directory),
            device=device.type,
            device_index=device.index or 0,  # "cuda" alone is the current device, 0
            compute_type=ct2_compute_type(ctranslate2, config.decode.precision, device),
        )
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(f"{directory}: not a loadable CTranslate2 model ({e})") from None

    def search(src_ids: list[list[int]], decode: DecodeConfig, guides: Guides = None):
        settings = replace(config, decode=decode)
        return translate_ids_ct2(translator, tokenizer, src_ids, settings, guides)

    return Engine(tokenizer, config, search, rules=check_ct2_decode, kind="ctranslate2")


def check_ct2_decode(decode: DecodeConfig) -> None:
    """Refuse the decode settings that tf runs and CTranslate2 cannot: beam search's stopping
    rules other than its patience (greedy search and sampling have none to follow)."""
    beam = not (is_greedy(decode) or decode.sampling)
    if beam and decode.beam_stop == "current_length":
        patience = " --set decode.patience=1" if decode.patience <= 0 else ""
        raise InputError(
            "decode.beam_stop current_length (transformers' early_stopping false, an imported "
            f"model's rule) is not CTranslate2's: --set decode.beam_stop=bound{patience} for "
            "its own"
        )
    if beam and decode.patience <= 0:
        raise InputError(
            "decode.patience 0 (search on until no live hypothesis can win) is tf's own; "
            "CTranslate2 needs a patience above 0"
        )
    if not decode.sampling and decode.nbest > ct2_most_hypotheses(decode):
        raise InputError(
            f"decode.nbest {decode.nbest}: CTranslate2 returns at most decode.beam_size x "
            f"decode.patience hypotheses, rounded ({decode.beam_size} x {decode.patience:g})"
        )


def ct2_most_hypotheses(decode: DecodeConfig) -> int:
    """The most hypotheses CTranslate2's beam search returns: beam x patience, rounded half up
    (tried: 5 x 0.5 returns 3, 1 x 0.1 none)."""
    return math.floor(decode.beam_size * _ct2_patience(decode) + 0.5)


def _ct2_patience(decode: DecodeConfig) -> float:
    """The patience CTranslate2 searches with: `decode.patience`, or 1 for greedy search and
    sampling, which never read it (and an imported model's 0 would fail the call)."""
    return 1.0 if is_greedy(decode) or decode.sampling else decode.patience


def ct2_compute_type(ctranslate2, precision: str, device: torch.device) -> str:
    """CTranslate2's compute_type for `decode.precision`, checked to exist on `device`."""
    compute_type = CT2_COMPUTE_TYPES[precision]
    if compute_type == "default":  # the exported type, which CTranslate2 converts as needed
        return compute_type
    supported = ctranslate2.get_supported_compute_types(device.type, device.index or 0)
    if compute_type not in supported:
        raise InputError(
            f"decode.precision={precision}: CTranslate2 on {device} computes in "
            f"{', '.join(sorted(supported))} only; use fp32, or auto (the exported type)"
        )
    return compute_type


def translate_ids_ct2(
    translator,
    tokenizer: Tokenizer,
    src_ids: list[list[int]],
    config: Config,
    guides: Guides = None,
) -> list[list[Hypothesis]]:
    """CTranslate2's search with `config.decode`'s settings; empty sources stay empty.

    CTranslate2 takes one length limit per call, ours is per sentence (a * len + b): the batch
    is searched under the largest limit, then the sentences whose output went past their own
    limit are searched again under it (one call per limit; few sentences on a trained model).
    Its length penalty divides by len ** alpha, not GNMT's ((5 + len) / 6) ** alpha, and its
    beam search never returns an empty output: with alpha 0 and `decode.min_len` 1 its search
    is ours. What its rules forbid (min length, repeated n-grams) it takes out before its
    softmax, as `decode.renormalize` true does. Its scores are turned into ours
    (`_tf_hypotheses`). A guide's forced language token (`lang_token_side: target`), then its
    prefix, are its `target_prefix` (it has no constraints: `Engine.guides` refuses them
    first); its limits count them, as ours do.
    """
    results = [[Hypothesis([], 0.0, 0.0)] for _ in src_ids]
    limits = {i: length_limit(len(ids), config) for i, ids in enumerate(src_ids) if ids}
    if not limits:
        return results
    rows = list(limits)
    guides = guides or [None] * len(src_ids)
    longest = max(limits.values())
    _search_ct2(translator, tokenizer, src_ids, rows, longest, config, results, guides)
    over: dict[int, list[int]] = {}
    for i in rows:
        if len(results[i][0].tokens) > limits[i]:
            over.setdefault(limits[i], []).append(i)
    for limit, again in over.items():
        _search_ct2(translator, tokenizer, src_ids, again, limit, config, results, guides)
    return results


def length_limit(src_len: int, config: Config) -> int:
    """The most target tokens of a source of `src_len` pieces, as `search_batch` computes it."""
    decode = config.decode
    limit = min(decode.max_len_a * src_len + decode.max_len_b, config.model.max_positions - 1)
    return max(1, int(limit))  # capped first: a huge max_len_a makes no huge int


def _search_ct2(translator, tokenizer, src_ids, rows, limit, config, results, guides) -> None:
    """Search `rows` of `src_ids` under one length limit; their hypotheses into `results`.
    Sampling draws with CTranslate2's own generator, seeded by `decode.seed` at each call: the
    same input in the same batches gives the same samples (not tf's samples: another sampler)."""
    import ctranslate2

    decode: DecodeConfig = config.decode
    sources = [tokenizer.src_id_pieces(src_ids[i]) for i in rows]
    if decode.sampling:  # beam_size samples of each sentence, then the nbest best (as tf)
        ctranslate2.set_random_seed(decode.seed)
        search = dict(
            beam_size=1,
            num_hypotheses=decode.beam_size,
            sampling_topk=_ct2_topk(decode.sampling_topk, tokenizer.tgt_vocab_size),
            sampling_topp=decode.sampling_topp,
            sampling_temperature=decode.sampling_temperature,
        )
    else:  # every hypothesis of the beam CTranslate2 returns: tf's scores rank them again
        returned = min(decode.beam_size, ct2_most_hypotheses(decode))
        search = dict(beam_size=decode.beam_size, num_hypotheses=max(decode.nbest, returned))
    prefixes = [_ct2_prefix(tokenizer, guides[i]) for i in rows]
    found = translator.translate_batch(
        sources,
        target_prefix=prefixes if any(prefixes) else None,
        **search,
        length_penalty=_ct2_alpha(decode),
        max_decoding_length=limit,
        min_decoding_length=decode.min_len,
        no_repeat_ngram_size=decode.no_repeat_ngram_size,
        patience=_ct2_patience(decode),
        max_batch_size=decode.max_tokens,
        batch_type="tokens",
        max_input_length=0,  # sources are cut to the model's limit already, never at 1024
        return_scores=True,
    )
    counted = _prefix_log_probs(translator, sources, prefixes, [guides[i] for i in rows])
    for i, source, result, prefix_lp in zip(rows, sources, found, counted):
        certain = len(guides[i].forced) if guides[i] else 0
        hyps = _tf_hypotheses(
            translator, tokenizer, source, result, limit, decode, certain, prefix_lp
        )
        results[i] = hyps[: decode.nbest]


def _ct2_prefix(tokenizer: Tokenizer, guide: Guide | None) -> list[str] | None:
    """A guide's `target_prefix`: the language token the decoder is made to write first
    (`Guide.forced`), then the request's prefix; None for no guide."""
    return tokenizer.tgt_pieces(list(guide.forced + guide.prefix)) if guide else None


def _prefix_log_probs(translator, sources, prefixes, guides) -> list[float]:
    """Each row's log-probability of its request's prefix, which tf's score counts and
    CTranslate2's leaves out (its search scores a target prefix's tokens 0, the forced
    language token's too, which tf counts as certain: 0 as well). One forced decoding of the
    rows with a prefix, their language token's log-probability dropped; 0.0 for the others."""
    asks = [n for n, g in enumerate(guides) if g and g.prefix]
    totals = [0.0] * len(sources)
    if not asks:
        return totals
    scored = translator.score_batch(
        [sources[n] for n in asks], [prefixes[n] for n in asks], max_input_length=0
    )
    for n, result in zip(asks, scored):
        certain = len(guides[n].forced)
        totals[n] = sum(result.log_probs[certain : len(prefixes[n])])  # not the EOS after it
    return totals


def _ct2_topk(topk: int, vocab_size: int) -> int:
    """CTranslate2's sampling_topk for ours: its 0 is every token, our -1; a k past the
    vocabulary is every token too, as `model.search.sample_tokens` takes it (CTranslate2 would
    fail every batch on it)."""
    return 0 if topk < 0 or topk >= vocab_size else topk


def _ct2_alpha(decode: DecodeConfig) -> float:
    """The length penalty CTranslate2 searches with. Greedy search and sampling have none
    (their choices never depend on one): the scores it returns are then the plain sums."""
    return 0.0 if is_greedy(decode) or decode.sampling else decode.length_penalty


def _tf_hypotheses(
    translator, tokenizer, source, result, limit, decode, certain: int = 0, prefix_lp: float = 0.0
) -> list[Hypothesis]:
    """CTranslate2's hypotheses with tf's scores, best first by them.

    CTranslate2 scores log P / |Y| ** alpha, and tf log P / lp(|Y|) (`decode.length_penalty_form`:
    GNMT's ((5 + |Y|) / 6) ** alpha, or CTranslate2's own; greedy: log P), log P and |Y|
    counting the EOS (`Hypothesis.log_prob` is that sum) and a target prefix's tokens. In its
    log P CTranslate2 counts none of the prefix's tokens (it forces them at a score of 0):
    tf counts the `certain` first ones (the language token a decoder is made to write) as 0
    too, and the request's prefix by its log-probability, `prefix_lp`, added back. A
    hypothesis cut at the length limit has no EOS in CTranslate2, where tf forces one and
    counts its log-probability (unless `decode.score_forced_eos` is false): those few are
    scored again, with EOS, by CTranslate2's forced decoding, every token but the certain ones.
    """
    lp = LengthPenalty(0.0) if is_greedy(decode) else length_penalty(decode)
    hyps = []
    for pieces, score in zip(result.hypotheses, result.scores):
        if len(pieces) >= limit:
            (forced,) = translator.score_batch([source], [pieces], max_input_length=0)
            counted = forced.log_probs if decode.score_forced_eos else forced.log_probs[:-1]
            log_prob = sum(counted[certain:])
        else:
            log_prob = score * (len(pieces) + 1) ** _ct2_alpha(decode) + prefix_lp
        tf_score = log_prob / lp(len(pieces) + 1)
        hyps.append(Hypothesis(tokenizer.tgt_piece_ids(pieces), tf_score, log_prob))
    return sorted(hyps, key=lambda h: h.score, reverse=True)  # stable: ties keep their order
