"""What `tf translate` and `tf eval` decode with: the run's PyTorch model (fp32, or its linear
layers in dynamic int8), or an exported CTranslate2 directory, behind one streaming interface.

Each engine yields, for every input line in order, the source ids it translated and the
hypotheses (ids, best first), so output formatting and scoring never depend on the engine.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from cli.config import Config, DecodeConfig, load_config, with_overrides
from cli.exporters.ctranslate2 import TF_CONFIG, is_ctranslate2_dir
from cli.inference.decoding import Grouping, chunks, encode_sources, translate_ids
from cli.training.checkpoint import CheckpointError, load_for_inference
from data.errors import InputError
from data.tokenizer import Tokenizer
from model.search import Hypothesis
from model.transformer import Transformer

Results = Iterator[tuple[list[int], list[Hypothesis]]]
# (source ids, decode settings) -> each source's hypotheses, best first, in input order
Search = Callable[[list[list[int]], DecodeConfig], list[list[Hypothesis]]]


@dataclass
class Engine:
    tokenizer: Tokenizer
    config: Config  # the run's, with the command line's decode overrides
    search: Search
    model: Transformer | None = None  # the PyTorch model, when that is the engine

    def stream(self, lines: Iterable[str], source: str, group: Grouping = chunks) -> Results:
        """(source ids as translated, hypotheses) for each input line, in order, group by group
        (`chunks`, or `as_they_arrive` for interactive input), with the config's settings; the
        ids are encoded and truncated once, here (`--attention` reuses them)."""
        max_src, first = self.config.model.max_positions, 1
        for chunk in group(lines):
            src_ids = encode_sources(self.tokenizer, chunk, max_src, source, first)
            yield from zip(src_ids, self.search(src_ids, self.config.decode))
            first += len(chunk)


def load_engine(run: str, device: torch.device, overrides: list[str], int8: bool = False) -> Engine:
    """The engine for RUN (a run directory or checkpoint) or for an exported CTranslate2 DIR."""
    if is_ctranslate2_dir(run):
        if int8:
            raise InputError(f"{run}: --int8 is for PyTorch models; export with --quantization")
        return ctranslate2_engine(Path(run), device, overrides)
    model, tokenizer, config = load_for_inference(run, device)
    config = with_overrides(config, overrides)
    if int8:
        model = quantize_int8(model, device)
        # Its layers take fp32 activations (quantized on the fly), never autocast's bf16.
        config = replace(config, decode=replace(config.decode, precision="fp32"))

    def search(src_ids: list[list[int]], decode: DecodeConfig) -> list[list[Hypothesis]]:
        return translate_ids(model, tokenizer, src_ids, decode, device)

    return Engine(tokenizer, config, search, model)


def quantize_int8(model: Transformer, device: torch.device) -> Transformer:
    """The model with its nn.Linear layers (attention outputs, feed-forward, generator) in
    dynamic int8: weights stored in int8, activations quantized on the fly, CPU only."""
    if device.type != "cpu":
        raise InputError("--int8 runs on the CPU only (use --device cpu)")
    with warnings.catch_warnings():  # torch.ao's deprecation notices, not the user's business
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


def ctranslate2_engine(directory: Path, device: torch.device, overrides: list[str]) -> Engine:
    """A CTranslate2 Translator over DIR, with DIR's SentencePiece model(s) and decode settings."""
    try:
        import ctranslate2
    except ImportError:
        raise InputError("CTranslate2 is needed to run it: pip install 'tf[export]'") from None
    tokenizer = Tokenizer.load(directory)
    config = with_overrides(load_config(directory / TF_CONFIG), overrides)
    try:
        translator = ctranslate2.Translator(str(directory), device=device.type)
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(f"{directory}: not a loadable CTranslate2 model ({e})") from None

    def search(src_ids: list[list[int]], decode: DecodeConfig) -> list[list[Hypothesis]]:
        return translate_ids_ct2(translator, tokenizer, src_ids, replace(config, decode=decode))

    return Engine(tokenizer, config, search)


def translate_ids_ct2(
    translator, tokenizer: Tokenizer, src_ids: list[list[int]], config: Config
) -> list[list[Hypothesis]]:
    """CTranslate2's search with `config.decode`'s settings; empty sources stay empty.

    CTranslate2 takes one length limit per call, ours is per sentence (a * len + b): the batch
    is searched under the largest limit, then the sentences whose output went past their own
    limit are searched again under it (one call per limit; few sentences on a trained model).
    Its length penalty divides by len ** alpha, not GNMT's ((5 + len) / 6) ** alpha, and its
    beam search never returns an empty output: with alpha 0 and `decode.min_len` 1 its search
    is ours.
    """
    if config.decode.patience <= 0:
        raise InputError(
            "decode.patience 0 (search on until no live hypothesis can win) is tf's own; "
            "CTranslate2 needs a patience above 0"
        )
    results = [[Hypothesis([], 0.0, 0.0)] for _ in src_ids]
    limits = {i: _length_limit(len(ids), config) for i, ids in enumerate(src_ids) if ids}
    if not limits:
        return results
    rows = list(limits)
    _search_ct2(translator, tokenizer, src_ids, rows, max(limits.values()), config, results)
    over: dict[int, list[int]] = {}
    for i in rows:
        if len(results[i][0].tokens) > limits[i]:
            over.setdefault(limits[i], []).append(i)
    for limit, again in over.items():
        _search_ct2(translator, tokenizer, src_ids, again, limit, config, results)
    return results


def _length_limit(src_len: int, config: Config) -> int:
    """The most target tokens of a source of `src_len` pieces, as `search_batch` computes it."""
    decode = config.decode
    limit = int(decode.max_len_a * src_len + decode.max_len_b)
    return max(1, min(limit, config.model.max_positions - 1))


def _search_ct2(translator, tokenizer, src_ids, rows, limit, config, results) -> None:
    """Search `rows` of `src_ids` under one length limit; their hypotheses into `results`."""
    decode: DecodeConfig = config.decode
    found = translator.translate_batch(
        [tokenizer.src_id_pieces(src_ids[i]) for i in rows],
        beam_size=decode.beam_size,
        num_hypotheses=decode.nbest,
        length_penalty=decode.length_penalty,
        max_decoding_length=limit,
        min_decoding_length=decode.min_len,
        no_repeat_ngram_size=decode.no_repeat_ngram_size,
        patience=decode.patience,
        max_batch_size=decode.max_tokens,
        batch_type="tokens",
        return_scores=True,
    )
    for i, result in zip(rows, found):
        results[i] = [
            Hypothesis(tokenizer.tgt_piece_ids(pieces), score, score)
            for pieces, score in zip(result.hypotheses, result.scores)
        ]
