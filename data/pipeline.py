"""The data path of a training run, as one pipeline: the training corpora read, the run's
tokenizer chosen, the pairs cleaned, encoded and batched by the token budget (this rank's
share), the dev pairs for the loss, and a dev subset decoded for BLEU.

The tokenizer is chosen here and only here, one of three ways:
- trained: SentencePiece on the training corpora, as `data.vocab_size` etc. ask (the default);
  a run reuses the one in its folder when it was trained with the same settings;
- adopted: `data.tokenizer` names a folder (a teacher's RUN/tokenizer), copied into the run;
- imported: that folder holds an imported model's tokenizer (`tf import`: Marian's two
  SentencePiece models and its vocabulary), read by `Tokenizer.load` as any other.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from data.added_tokens import add_tokens
from data.batching import Batch, BatchIterator, RaggedConcat
from data.clean import Reference, first_row_holding
from data.config import (
    CorpusConfig,
    DataConfig,
    SetConfig,
    check_trainable,
    corpus_name,
    direction_name,
)
from data.corpus import (
    SIDES,
    encode_corpus,
    filter_pairs,
    load_corpus,
    token_ids,
    where_row,
)
from data.errors import InputError
from data.files import write_json
from data.prepared import Filters, Progress, prepare_corpus, silent
from data.tokenizer import (
    TOKENIZER_SETTINGS,
    Tokenizer,
    read_tokenizer_settings,
    train_tokenizer,
)

log = logging.getLogger(__name__)

TOKENIZER_PAIRS = 1_000_000  # SentencePiece samples 2M sentences of them (both sides, joint)


@dataclass(frozen=True)
class Batching:
    """What the data path takes from the rest of a run's settings."""

    max_tokens: int  # per batch, padding counted (train.max_tokens)
    max_sentences: int
    seed: int  # shuffling, and the tokenizer's sample (train.seed)
    max_positions: int  # the model's: longer dev pairs stay out of the dev loss
    eval_bleu_sentences: int  # dev sentences decoded for BLEU; 0: all
    decoder_start: str  # model.decoder_start: the id every target starts from
    rank: int = 0  # this process's share of the batches (torchrun)
    world_size: int = 1
    # Batches per update on each rank (train.update_freq): an epoch is cut into whole updates
    # of all ranks, so a run resumes in any number of ranks taking the same batches an update.
    update_freq: int = 1


@dataclass
class DevSet:
    """The part of one dev set decoded for BLEU: its direction's sources and references."""

    name: str  # its direction, "es-en"
    src_ids: list[list[int]]  # the first sentences (their language token first)
    refs: list[str]
    # The token its decoder writes first (`lang_token_side: target`: the target language's)
    forced: list[int] = field(default_factory=list)
    # A direction no training corpus trains (`DataConfig.watched_directions`): logged, never
    # what dev_bleu, early stopping and best.pt follow.
    watched: bool = False


@dataclass
class TrainingData:
    tokenizer: Tokenizer
    train: BatchIterator
    dev_batches: list[Batch]  # the pairs of the dev sets followed (not watched), for the loss
    dev_sets: list[DevSet]  # one per direction validated, decoded for BLEU
    report: dict  # RUN/data.json: what each training corpus gave
    # {"data.train[i] (SPEC)": sha256 of its pairs as batched}: a checkpoint records them, and
    # a resume that finds another corpus's content under a name refuses (the batches it
    # continues are positions in these pairs).
    digests: dict[str, str]
    watched_batches: list[Batch] = field(default_factory=list)  # the watched sets' pairs


def prepare_training_data(
    d: DataConfig,
    batching: Batching,
    tokenizer_dir: Path,
    resume: bool,
    progress: Progress = silent,
    show_bars: bool = False,
) -> TrainingData:
    """Everything a run trains and validates on, from the `data` section.

    Args:
        d: the corpora, cleaning and tokenizer settings.
        batching: the batch budget and the model's limits.
        tokenizer_dir: the run's tokenizer folder (RUN/tokenizer), filled as `d` asks.
        resume: a resumed run never changes its tokenizer (its embeddings belong to it).
        progress: makes a progress bar for a stage (the caller's, e.g. tqdm).
        show_bars: `datasets`' own bars while a corpus is read (on a terminal).

    Raises:
        InputError: a corpus, tokenizer or setting that cannot work, in one line.
    """
    corpora = load_training_corpora(d, show_bars)
    tokenizer = choose_tokenizer(d, tokenizer_dir, joined(corpora), batching.seed, resume, progress)
    return batch_training_data(d, batching, tokenizer, corpora, progress)


def load_training_corpora(d: DataConfig, show_bars: bool = False) -> list[datasets.Dataset]:
    """Each corpus of `data.train`, read (and cached as Arrow) through `datasets`."""
    check_trainable(d)
    if show_bars:  # reading a large corpus takes a while: show it
        datasets.enable_progress_bars()
    try:
        return [load_set(d, c) for c in d.corpora()]
    finally:
        datasets.disable_progress_bars()


OTHER_SIDE = {"src": "tgt", "tgt": "src"}


def load_set(d: DataConfig, s: SetConfig, sides: tuple[str, ...] = SIDES) -> datasets.Dataset:
    """The pairs of corpus `s` in its direction: read in its languages, its sides swapped when
    it says `reverse` (es<->en needs one corpus listed twice); `sides` of the direction alone
    (("src",): its sources, the other side's file unread)."""
    if s.reverse:
        sides = tuple(OTHER_SIDE[side] for side in sides)
    ds = load_corpus(s.corpus, *d.file_languages(s), sides)
    return swapped(ds) if s.reverse else ds


def swapped(ds: datasets.Dataset) -> datasets.Dataset:
    """The pairs read the other way: each side is the other's."""
    return ds.rename_columns({c: OTHER_SIDE[c] for c in ds.column_names if c in OTHER_SIDE})


def joined(corpora: list[datasets.Dataset]) -> datasets.Dataset:
    """All the training pairs as one dataset (no copy), e.g. for the tokenizer; a single corpus
    is itself, so its fingerprint and its tokenizer settings stay what they were."""
    return corpora[0] if len(corpora) == 1 else datasets.concatenate_datasets(corpora)


def batch_training_data(
    d: DataConfig,
    batching: Batching,
    tokenizer: Tokenizer,
    corpora: list[datasets.Dataset],
    progress: Progress = silent,
) -> TrainingData:
    """Clean, encode and filter the training corpora (cached as memory-mapped ids) and batch
    their mix by the token budget; the dev set for loss and BLEU."""
    devs = [(d.direction(s), load_set(d, s)) for s in d.dev_sets()]
    trained = {d.direction(c) for c in d.corpora()}
    for way in sorted(trained - {way for way, _ in devs}):  # neither scored nor best.pt's choice
        log.warning("no dev set in data.dev translates %s: it is not validated", "->".join(way))
    if watched := d.watched_directions():
        log.info(
            "data.dev: watching %s, which no corpus trains (logged each, their mean as "
            "watched_bleu); dev_bleu, early stopping and best.pt follow the trained directions",
            ", ".join("->".join(way) for way in watched),
        )
    check_tags(d, corpora)
    references = {}
    if d.clean:  # no training pair may sit in the sets the run is scored on, either way round:
        tests = [(d.direction(s), load_set(d, s)) for s in d.test_sets()]
        for direction in trained:  # an en->es pair that is an es->en test pair read backwards
            held = [ds for way, ds in devs + tests if way == direction]
            held += [swapped(ds) for way, ds in devs + tests if way == direction[::-1]]
            references[direction] = Reference.of(held)
    parts = []
    several = len(trained) > 1
    for spec, ds in zip(d.corpora(), corpora):
        prefixes = tuple(d.source_prefix(spec)), tuple(d.target_prefix(spec))
        filters = Filters(d.clean, d.max_len, d.max_len_ratio, *prefixes)
        reference = references.get(d.direction(spec))
        name = f"{spec.corpus} ({direction_name(d.direction(spec))})" if several else spec.corpus
        parts.append(prepare_corpus(ds, tokenizer, filters, reference, name, progress))
    kept = [p.counts["kept"] for p in parts]
    weights = sampled_weights(kept, [spec.weight for spec in d.corpora()], d.temperature)
    report = []
    for i, (spec, prepared, weight) in enumerate(zip(d.corpora(), parts, weights)):
        report.append(corpus_report(spec, prepared.counts, weight))
        if several:
            report[-1]["direction"] = direction_name(d.direction(spec))
        if report[-1]["per_epoch"] == 0:
            raise InputError(
                f"{corpus_name(d, i)} ({spec.corpus}): weight {weight:g} of its {kept[i]} "
                f"pairs is no pair per epoch; give it a weight of {1 / max(kept[i], 1):.2g} "
                "or more"
                + (f" at data.temperature {d.temperature:g}" if d.temperature != 1 else "")
            )
    b = batching
    special = dict(
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.decoder_start_id(b.decoder_start),
        eos_id=tokenizer.eos_id,
        src_pad_id=tokenizer.src_pad_id,
    )
    src = parts[0].src if len(parts) == 1 else RaggedConcat([p.src for p in parts])
    tgt = parts[0].tgt if len(parts) == 1 else RaggedConcat([p.tgt for p in parts])
    train = BatchIterator(
        src,
        tgt,
        max_tokens=b.max_tokens,
        max_sentences=b.max_sentences,
        seed=b.seed,
        rank=b.rank,
        world_size=b.world_size,
        split=b.world_size * b.update_freq,
        corpora=list(zip(kept, weights)),
        pad_multiple=d.pad_multiple,
        max_width=b.max_positions,
        **special,
    )
    (dev_batches, watched_batches), sets = dev_sets(d, b, tokenizer, devs, special)
    digests = {
        f"{corpus_name(d, i)} ({spec.corpus})": part.digest
        for i, (spec, part) in enumerate(zip(d.corpora(), parts))
    }
    report = {"corpora": report}
    return TrainingData(tokenizer, train, dev_batches, sets, report, digests, watched_batches)


def check_tags(d: DataConfig, corpora: list[datasets.Dataset]) -> None:
    """No corpus's text holds a tag: a sentence that did would look tagged (its tag is one
    piece wherever it stands).

    Raises:
        InputError: naming the tag, the corpus and the line.
    """
    tags = d.tags()
    for spec, ds in zip(d.corpora(), corpora) if tags else ():
        found = first_row_holding(ds, tags)
        if found is not None:
            row, tag = found
            where = where_row(spec.corpus, *d.file_languages(spec), row)  # the file's line
            raise InputError(
                f"{where}: holds the text {tag!r}, a reserved piece of the run (a tag, a "
                "target-language token); a tag must be a piece no sentence holds: choose another"
            )


def sampled_weights(pairs: list[int], weights: list[float], temperature: float) -> list[float]:
    """Each corpus's weight in the epoch (pairs seen per pair kept) under `data.temperature`:
    its share of the epoch becomes (weight x pairs) ** (1 / T) over the sum of those, the
    epoch keeping its size. T = 1 gives the weights back unchanged."""
    if temperature == 1:
        return list(weights)
    sizes = [w * n for w, n in zip(weights, pairs)]
    tempered = [size ** (1 / temperature) for size in sizes]
    return [
        t / sum(tempered) * sum(sizes) / n if n else w for t, n, w in zip(tempered, pairs, weights)
    ]


def corpus_report(spec, counts: dict, weight: float | None = None) -> dict:
    """One corpus's entry of RUN/data.json: read, removed by rule, kept, and its share
    (`weight`: its weight after temperature sampling, where that changed it)."""
    weight = spec.weight if weight is None else weight
    whole, fraction = divmod(weight, 1.0)
    kept = counts["kept"]
    report = {
        "spec": spec.corpus,
        "read": counts["read"],
        "removed": counts["removed"],
        "kept": kept,
        "weight": spec.weight,
        "per_epoch": int(whole) * kept + round(fraction * kept),
        "tag": spec.tag or None,
    }
    if weight != spec.weight:
        report["sampled_weight"] = weight
    return report


def bleu_shares(
    directions: list[tuple[str, str]], sizes: list[int], per_direction: int
) -> list[int]:
    """How many of its first sentences each dev set gives to BLEU: `per_direction` (0: all)
    shared evenly between the sets of one direction, what a short set cannot use going to the
    others (shortest first, a remainder to the earlier of equal ones)."""
    if not per_direction:
        return list(sizes)
    shares = [0] * len(sizes)
    for way in dict.fromkeys(directions):
        members = sorted((i for i, w in enumerate(directions) if w == way), key=sizes.__getitem__)
        left = per_direction
        for k, i in enumerate(members):
            shares[i] = min(sizes[i], -(-left // (len(members) - k)))  # an even share, rounded up
            left -= shares[i]
    return shares


def dev_sets(
    d: DataConfig,
    b: Batching,
    tokenizer: Tokenizer,
    devs: list[tuple[tuple[str, str], datasets.Dataset]],
    special: dict,
) -> tuple[tuple[list[Batch], list[Batch]], list[DevSet]]:
    """Dev batches for the loss (the pairs the model can take), of the sets followed and of
    those watched (`DataConfig.watched_directions`), and, per direction, the first sentences of
    each of its sets, raw, for BLEU as `tf eval` computes it. A multilingual run's sources
    start with their target-language token, as `tf translate --to` puts it."""
    limit = b.max_positions
    watched = d.watched_directions()
    fit: dict[bool, list[datasets.Dataset]] = {False: [], True: []}  # by watched
    sets: dict[str, DevSet] = {}
    shares = bleu_shares(
        [way for way, _ in devs], [len(ds) for _, ds in devs], b.eval_bleu_sentences
    )
    for (direction, dev), spec, share in zip(devs, d.dev_sets(), shares):
        head = " ".join(d.source_prefix(spec))  # its target-language token, its tag
        if head:
            dev = dev.map(
                lambda row, head: {"src": f"{head} {row['src']}"}, fn_kwargs={"head": head}
            )
        encoded = encode_corpus(dev, tokenizer)
        forced = tokenizer.tgt_piece_ids(d.target_prefix(spec))
        if forced:  # the loss's targets start with it too, as training's do
            encoded = encoded.map(
                lambda row, head: {"tgt_ids": head + row["tgt_ids"]}, fn_kwargs={"head": forced}
            )
        pairs = filter_pairs(encoded, max_len=limit - 1, name=spec.corpus)[0]
        fit[direction in watched].append(pairs)
        name = direction_name(direction)  # two sets of one direction are scored as one
        part = sets.setdefault(name, DevSet(name, [], [], forced, direction in watched))
        first = encoded.select(range(share))["src_ids"]
        part.src_ids += [tokenizer.truncate_src(ids, limit) for ids in first]
        part.refs += dev.select(range(share))["tgt"]
    followed, watched_pairs = (loss_batches(d, b, pairs, special) for pairs in fit.values())
    return (followed, watched_pairs), list(sets.values())


def loss_batches(
    d: DataConfig, b: Batching, fit: list[datasets.Dataset], special: dict
) -> list[Batch]:
    """The encoded pairs of `fit` in batches of the training budget, in order; none of none."""
    if not fit:
        return []
    dev_fit = joined(fit)
    dev_batches = BatchIterator(
        token_ids(dev_fit, "src_ids"),
        token_ids(dev_fit, "tgt_ids"),
        max_tokens=b.max_tokens,
        max_sentences=b.max_sentences,
        seed=b.seed,  # unused: no shuffling
        shuffle=False,
        pad_multiple=d.pad_multiple,
        max_width=b.max_positions,
        **special,
    )
    return list(dev_batches)


# ------------------------------------------------------------------------ the run's tokenizer


def choose_tokenizer(
    d: DataConfig,
    directory: Path,
    corpus: datasets.Dataset,
    seed: int,
    resume: bool,
    progress: Progress = silent,
) -> Tokenizer:
    """The run's tokenizer in `directory`: adopted (`data.tokenizer`), or trained unless the one
    there was trained as `d` asks.

    A resumed run never retrains: its checkpoint's embeddings belong to its tokenizer, so a
    config asking for another one is an error naming both.
    """
    if d.tokenizer:
        return adopt_tokenizer(Path(d.tokenizer), directory, resume, d.new_tokens())
    wanted = tokenizer_settings(d, corpus)
    if Tokenizer.found_in(directory):
        found = read_tokenizer_settings(directory)
        if found == wanted:
            return Tokenizer.load(directory)
        if resume:
            if found is None:  # trained before settings were recorded; the digest still checks
                return Tokenizer.load(directory)
            differ = [k for k in wanted if k != "corpus_fingerprint" and found.get(k) != wanted[k]]
            if not differ:  # the same corpus spec, touched since: resume as the checkpoint says
                return Tokenizer.load(directory)
            listing = ", ".join(f"{k} {found.get(k)!r} (config: {wanted[k]!r})" for k in differ)
            raise InputError(f"{directory}: the run's tokenizer was trained with {listing}")
        log.info("the tokenizer in %s does not match the config: retraining it", directory)
        shutil.rmtree(directory)  # the run's own folder: whatever kind of tokenizer it held
    log.info(
        "training a %s tokenizer (vocab %d) on %d pairs",
        d.tokenizer_type,
        d.vocab_size,
        len(corpus),
    )
    return train_tokenizer_for(d, corpus, directory, seed, progress)


def check_before_work(d: DataConfig, decoder_start: str, run_tokenizer: Path | None = None) -> None:
    """Before any data work: a corpus to train on, and the run's tokenizer loads and has the
    token the decoder starts from (an imported Marian tokenizer has no BOS: `model.decoder_start:
    pad`): `run_tokenizer`, a resumed run's own, else the one `data.tokenizer` names.

    Raises:
        InputError: naming the tokenizer folder and what it lacks.
    """
    check_trainable(d)
    if not d.dev_sets():  # (a model alone's config, imported, has none)
        raise InputError(
            "data.dev names no dev set: a run validates on one (its loss, BLEU and best.pt)"
        )
    if run_tokenizer is not None and Tokenizer.found_in(run_tokenizer):
        Tokenizer.load(run_tokenizer).decoder_start_id(decoder_start)
    elif d.tokenizer:
        Tokenizer.load(Path(d.tokenizer)).decoder_start_id(decoder_start)


def adopt_tokenizer(
    source: Path, directory: Path, resume: bool, added: list[str] | None = None
) -> Tokenizer:
    """`data.tokenizer`: a copy of the tokenizer in `source` becomes the run's own, so the run
    directory is self-contained: a resumed run takes its own copy (the checkpoint's digest
    checks it), wherever it is resumed from and whatever became of `source` since. `added`:
    new language tokens the copy gets at its next ids (`data.new_languages`; `source` is
    left as it is). The copy is made beside `directory` and renamed into place: a folder
    there is whole, which a run killed before its first checkpoint restarts from."""
    if resume and Tokenizer.found_in(directory):
        return Tokenizer.load(directory)
    wanted = Tokenizer.load(source)
    if Tokenizer.found_in(directory) and not added:
        have = Tokenizer.load(directory)
        if have.digest() == wanted.digest():
            return have
    partial = directory.with_name(f".{directory.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for path in wanted.model_paths():
        shutil.copyfile(path, partial / path.name)
    add_tokens(partial, added or [])
    shutil.rmtree(directory, ignore_errors=True)
    partial.rename(directory)
    log.info("using the tokenizer of %s", source)
    return Tokenizer.load(directory)


def tokenizer_settings(d: DataConfig, corpus: datasets.Dataset) -> dict[str, Any]:
    """What a run's tokenizer must have been trained with to serve `d`."""
    return {
        "tokenizer_type": d.tokenizer_type,
        "vocab_size": d.vocab_size,
        "joint_vocab": d.joint_vocab,
        "character_coverage": d.character_coverage,
        "corpus": d.train if isinstance(d.train, str) else [settings_of(c) for c in d.corpora()],
        "corpus_fingerprint": corpus._fingerprint,  # the corpus's content, through `datasets`
        **({"tags": d.tags()} if d.tags() else {}),  # (absent for untagged runs, as before tags)
    }


def settings_of(c: CorpusConfig) -> dict[str, Any]:
    """A corpus entry as a tokenizer's settings record it: the direction fields only where
    set, so that a run from before directions existed keeps its tokenizer."""
    fields = asdict(c)
    for key in ("src_lang", "tgt_lang", "reverse"):
        if not fields[key]:
            del fields[key]
    return fields


def tokenizer_sample(n: int, seed: int) -> np.ndarray | None:
    """The rows the tokenizer reads: all of a corpus up to TOKENIZER_PAIRS, else a seeded
    sample of that many in corpus order, so that its time and memory stay bounded."""
    if n <= TOKENIZER_PAIRS:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, TOKENIZER_PAIRS, replace=False))


def sentences(
    corpus: datasets.Dataset, side: str, rows: np.ndarray | None, stage: str, progress: Progress
) -> Iterator[str]:
    """One side's sentences of `rows` (None: all), read in Arrow batches, with a bar."""
    part = corpus.select_columns([side])
    part = part if rows is None else part.select(rows)
    bar = progress(stage, len(part))
    try:
        for batch in part.iter(batch_size=10_000):
            bar.update(len(batch[side]))
            yield from batch[side]
    finally:
        bar.close()


def train_tokenizer_for(
    d: DataConfig, corpus: datasets.Dataset, out_dir: Path, seed: int, progress: Progress = silent
) -> Tokenizer:
    """Train the tokenizer `d` asks for into `out_dir`, recording its settings."""
    rows = tokenizer_sample(len(corpus), seed)
    tokenizer = train_tokenizer(
        sentences(corpus, "src", rows, "tokenizer: reading sources", progress),
        sentences(corpus, "tgt", rows, "tokenizer: reading targets", progress),
        out_dir,
        vocab_size=d.vocab_size,
        model_type=d.tokenizer_type,
        joint=d.joint_vocab,
        character_coverage=d.character_coverage,
        seed=seed,
        tags=d.tags(),
    )
    write_json(out_dir / TOKENIZER_SETTINGS, tokenizer_settings(d, corpus))
    return tokenizer
