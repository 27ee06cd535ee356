"""Document mode against line mode on the bundled test set (issue 69, item 5).

The test verses are joined into paragraphs of 2 to 8 verses (sizes drawn with seed 0) and
translated three ways with one model:

  document   the paragraphs as one document, a blank line between two (`tf translate
             --document`): split into sentences, all translated in the usual batches.
  paragraph  each paragraph as one line, as `tf translate` reads lines; "before" is how tf
             translated such a line before issue 69 (cut at the model's limit), "now" in parts.
  verses     each verse on a line of its own: the reference, what a sentence-aligned corpus
             gets.

Scores (sacrebleu BLEU and chrF) are on units where the document's sentences and the verses
end together (a verse holding several sentences, or a sentence running over several verses
ending in `:` or `;`, is one unit, its references joined); the verse translations are joined
into the same units, so both are scored on the same segmentation. The paragraph translations
are scored per paragraph, with the document's and the verses' joined per paragraph beside them.
Throughput: source verses a second of the document (parse, translate, render) and of the verses
line by line, the same text, alternately, the median of `--repeats`.

    python -m benchmarks.documents_bench --run RUN [--verses 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import cpu_name, print_table
from cli.inference.decoding import hypothesis_texts, source_ids, splitter_for
from cli.inference.engines import Engine, load_engine
from cli.inference.scoring import score
from data.corpus import load_corpus
from data.documents import parse_document


def paragraphs(verses: list[str], seed: int = 0) -> list[range]:
    """The verses' indices in paragraphs of 2 to 8, in order (as the splitter comparison)."""
    rng, out, n = random.Random(seed), [], 0
    while n < len(verses):
        k = rng.randint(2, 8)
        out.append(range(n, min(n + k, len(verses))))
        n += k
    return out


def translated(engine: Engine, lines: list[str]) -> list[str]:
    """The best translation of each line (every line whole: parts joined)."""
    return [
        hypothesis_texts(engine.tokenizer, hyps[:1])[0] for _, hyps in engine.stream(lines, "bench")
    ]


def as_before(engine: Engine, lines: list[str]) -> tuple[list[str], int]:
    """Lines translated as tf did before issue 69: a line over the model's limit cut there.
    Returns the translations and how many lines were cut."""
    limit = engine.config.model.max_positions
    ids = source_ids(engine.tokenizer, [engine.source_text(line, "bench") for line in lines])
    cut = sum(len(row) > limit for row in ids)
    rows = [engine.tokenizer.truncate_src(row, limit) if len(row) > limit else row for row in ids]
    found = engine.search(rows, engine.config.decode, None)
    return engine.tokenizer.decode_tgt([h[0].tokens for h in found]), cut


def units(text: str, verse_spans: list[tuple[int, int]], sentence_spans: list[tuple[int, int]]):
    """Groups (verse indices, sentence indices) of one paragraph line whose last verse and last
    sentence end at the same place: the finest segmentation both share."""
    out, verses, sentences = [], [], []
    v = s = 0
    while v < len(verse_spans) or s < len(sentence_spans):
        v_end = verse_spans[v][1] if v < len(verse_spans) else len(text) + 1
        s_end = sentence_spans[s][1] if s < len(sentence_spans) else len(text) + 1
        if v_end <= s_end:
            verses.append(v)
            v += 1
        if s_end <= v_end:
            sentences.append(s)
            s += 1
        if v_end == s_end:
            out.append((verses, sentences))
            verses, sentences = [], []
    if verses or sentences:
        out.append((verses, sentences))
    return out


def document_units(src: list[str], groups: list[range], split) -> list[tuple[list[int], range]]:
    """Each unit as (verse indices, its sentences' indices in the document's order)."""
    out, first = [], 0
    for group in groups:
        line, spans, at = " ".join(src[i] for i in group), [], 0
        for i in group:
            spans.append((at, at + len(src[i].rstrip())))
            at += len(src[i]) + 1
        sentences = split(line)
        for verses, ours in units(line, spans, sentences):
            out.append(([group[v] for v in verses], range(first + ours[0], first + ours[-1] + 1)))
        first += len(sentences)
    return out


def timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def run(run_dir: str, n_verses: int = 1000, repeats: int = 3, device: str = "cpu") -> dict:
    """The figures of item 5 for the model in `run_dir` on the first `n_verses` test verses."""
    test = load_corpus("bundled:bible-es-en/test", "es", "en")
    src, ref = list(test["src"])[:n_verses], list(test["tgt"])[:n_verses]
    engine = load_engine(run_dir, torch.device(device), [])
    groups = paragraphs(src)
    document_text = "\n\n".join(" ".join(src[i] for i in g) for g in groups) + "\n"
    split = splitter_for(engine.reading(""))

    def as_document() -> tuple[object, list[str]]:
        document = parse_document(document_text, split)
        out = translated(engine, document.sentences)
        return document.render(out), out

    translated(engine, src[:8])  # warm up
    doc_s, verse_s = [], []
    for _ in range(repeats):  # alternately, so that load on the machine falls on both
        seconds, (rendered, sentence_out) = timed(as_document, 1)
        doc_s.append(seconds)
        seconds, verse_out = timed(lambda: translated(engine, src), 1)
        verse_s.append(seconds)
    paragraph_lines = [" ".join(src[i] for i in g) for g in groups]
    now = translated(engine, paragraph_lines)
    before, cut = as_before(engine, paragraph_lines)

    unit_list = document_units(src, groups, split)
    unit_refs = [" ".join(ref[v] for v in verses) for verses, _ in unit_list]
    doc_units = [" ".join(sentence_out[s] for s in ours) for _, ours in unit_list]
    verse_units = [" ".join(verse_out[v] for v in verses) for verses, _ in unit_list]
    para_refs = [" ".join(ref[i] for i in g) for g in groups]
    doc_paras = rendered.rstrip("\n").split("\n\n")
    verse_paras = [" ".join(verse_out[i] for i in g) for g in groups]
    result = {
        "cpu": cpu_name(),
        "precision": engine.config.decode.precision,
        "beam": engine.config.decode.beam_size,
        "max_positions": engine.config.model.max_positions,
        "verses": len(src),
        "paragraphs": len(groups),
        "sentences": len(sentence_out),
        "units": len(unit_list),
        "single_verse_units": sum(len(v) == 1 for v, _ in unit_list),
        "paragraphs_cut_before": cut,
        "document_units": score(doc_units, unit_refs),
        "verses_units": score(verse_units, unit_refs),
        "document_paragraphs": score(doc_paras, para_refs),
        "verses_paragraphs": score(verse_paras, para_refs),
        "paragraph_lines_now": score(now, para_refs),
        "paragraph_lines_before": score(before, para_refs),
        "document_verses_per_s": len(src) / statistics.median(doc_s),
        "verses_per_s": len(src) / statistics.median(verse_s),
    }
    result["throughput_ratio"] = result["document_verses_per_s"] / result["verses_per_s"]
    return result


def table(r: dict) -> None:
    rows = [("translated as", "scored on", "BLEU", "chrF")]
    for key, way, unit in [
        ("document_units", "document", "units"),
        ("verses_units", "verses, a line each", "units"),
        ("document_paragraphs", "document", "paragraphs"),
        ("verses_paragraphs", "verses, a line each", "paragraphs"),
        ("paragraph_lines_now", "paragraph a line (now: in parts)", "paragraphs"),
        ("paragraph_lines_before", "paragraph a line (before: cut)", "paragraphs"),
    ]:
        rows.append((way, unit, f"{r[key]['bleu']:.2f}", f"{r[key]['chrf']:.2f}"))
    print_table(rows)
    print(
        f"{r['verses']} verses, {r['paragraphs']} paragraphs ({r['paragraphs_cut_before']} over "
        f"the model's {r['max_positions']} positions), {r['sentences']} sentences, {r['units']} "
        f"units ({r['single_verse_units']} of one verse); {r['cpu']}, {r['precision']}, beam "
        f"{r['beam']}: document {r['document_verses_per_s']:.1f} verses/s, line by line "
        f"{r['verses_per_s']:.1f} verses/s ({r['throughput_ratio']:.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--verses", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    table(run(str(args.run), args.verses, args.repeats, args.device))


if __name__ == "__main__":
    main()
