"""The `tf` command line: a thin Typer layer over the plain functions in `cli/`."""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from data.errors import InputError

app = typer.Typer(
    help="Train, run and score Transformer translation models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # plain help: "[stdout]" in a help text stays as written
)
tokenizer_app = typer.Typer(help="SentencePiece tokenizers.", no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")

SetOption = Annotated[
    Optional[list[str]],  # noqa: UP045 - typer reads the annotation at run time
    typer.Option("--set", help="Override a config value: section.key=value (repeatable)."),
]


Beam = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(help="Beam size [the run's decode.beam_size].", show_default=False),
]
Greedy = Annotated[bool, typer.Option(help="Greedy decoding (decode.beam_size=1).")]
Nbest = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(help="Hypotheses per sentence ('k ||| text') [decode.nbest].", show_default=False),
]
Lenpen = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(help="GNMT length penalty alpha [decode.length_penalty].", show_default=False),
]
InputFormat = Annotated[
    str,
    typer.Option(
        help='text: one sentence a line; jsonl: {"text": ..., "prefix": ..., '
        '"constraints": [...]} a line (the output starts with prefix, holds each constraint); '
        "document: plain text read whole, as paragraphs (blank lines between them; the lines "
        "of a paragraph flow into each other, so a file of one sentence a line without blank "
        "lines is one paragraph: use text for that), written back with its layout; srt: "
        "SubRip subtitles, numbers and timings kept."
    ),
]
Runs = Annotated[
    list[str],
    typer.Argument(
        help="Run directory, checkpoint file or exported CTranslate2 dir; several runs "
        "decode as an ensemble.",
        show_default=False,
    ),
]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")]
Int8 = Annotated[
    bool,
    typer.Option(
        "--int8", help="PyTorch model's linear layers in int8, a scale per activation row (CPU)."
    ),
]
DecodeSet = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--set", help="Override a decode setting: decode.KEY=VALUE (repeatable)."),
]
To = Annotated[
    str,
    typer.Option(
        "--to",
        help="Output language of a multilingual model (a line starting with a language token "
        "keeps it).",
        show_default=False,
    ),
]
Attention = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(help="Write DIR/NNNN.png: each line's cross-attention (needs matplotlib)."),
]
AttentionLayer = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(help="Decoder layer drawn by --attention [-1: the last].", show_default=False),
]
AttentionHead = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(help="Head drawn by --attention (default: the mean over heads)."),
]
From = Annotated[
    str,
    typer.Option(
        "--from",
        help="Source language, for a model that reads it (NLLB, M2M100, mBART-50: fra_Latn, "
        "fr, fr_XX); a line starting with a language token keeps it.",
        show_default=False,
    ),
]


def user_errors(fn):
    """Print expected failures as one line on stderr and exit 2, without a traceback.

    Under torchrun (`tf train`), a run's start ends alike on every rank
    (`distributed.agreed_start`): where any rank refused, rank 0 alone says why and every
    process exits 0, since torchrun reports any other exit with a traceback of its own
    (ChildFailedError). Once training runs, a rank that fails says so, tagged with its rank,
    and exits 2: torchrun then stops the others, which would wait for it."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from cli.training.distributed import StartFailed, launched_by_torchrun, refusals

        try:
            return fn(*args, **kwargs)
        except StartFailed as e:
            if rank() == 0:
                typer.echo(f"error: {e}", err=True)
            raise typer.Exit(0 if e.refused and launched_by_torchrun() else 2) from None
        except refusals() as e:
            tag = f"[rank {rank()}] " if launched_by_torchrun() and rank() else ""
            typer.echo(f"{tag}error: {e}", err=True)
            raise typer.Exit(2) from None
        except BrokenPipeError:  # `tf translate ... | head`
            sys.stderr.close()
            raise typer.Exit(0) from None
        except KeyboardInterrupt:  # Ctrl-C (training saves first: see stopping.Signals)
            typer.echo("", err=True)
            raise typer.Exit(130) from None

    return wrapper


def rank() -> int:
    """This process's rank under torchrun (RANK), else 0."""
    import os

    return int(os.environ.get("RANK", "0"))


def setup_logging() -> None:
    # Under torchrun every rank runs this program: only rank 0 speaks below a warning's level,
    # and the others' lines say which rank they come from.
    rank_ = rank()
    logging.basicConfig(
        level=logging.INFO if rank_ == 0 else logging.ERROR,
        format="%(asctime)s %(levelname)s " + (f"[rank {rank_}] " if rank_ else "") + "%(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


@tokenizer_app.command("train")
@user_errors
def tokenizer_train(
    config: Annotated[str, typer.Argument(help="YAML config (its `data` section is used).")],
    out: Annotated[Path, typer.Option(help="Folder for the SentencePiece model(s).")],
    set_: SetOption = None,
) -> None:
    """Train the SentencePiece tokenizer of a config on its training corpus."""
    from cli.commands.tokenizer import run_tokenizer_train

    typer.echo(run_tokenizer_train(config, set_ or [], out))


@app.command()
@user_errors
def train(
    config: Annotated[Optional[str], typer.Argument(help="YAML config or a shipped name.")] = None,  # noqa: UP045
    set_: SetOption = None,
    out: Annotated[Optional[Path], typer.Option(help="Run directory [runs/<config name>].")] = None,  # noqa: UP045
    resume: Annotated[Path | None, typer.Option(help="Continue the run in this directory.")] = None,  # noqa: UP045
    force: Annotated[bool, typer.Option(help="Start afresh in an existing run directory.")] = False,
    allow_config_change: Annotated[
        bool, typer.Option(help="Resume even though the config differs.")
    ] = False,
    init: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Start from this checkpoint's weights and shapes (e.g. tf prune's)."),
    ] = None,
) -> None:
    """Train a model (training the tokenizer first if the run has none)."""
    from cli.commands.train import run_train, train_config

    cfg = train_config(config, set_ or [], resume, allow_config_change, init)
    run = resume or out or Path("runs") / Path(config).stem
    run_train(cfg, run, resume=resume is not None, force=force)


@app.command()
@user_errors
def translate(
    runs: Runs,
    input: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-i", "--input", help="Source text [stdin]."),
    ] = None,
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="Output [stdout]."),
    ] = None,
    beam: Beam = None,
    greedy: Greedy = False,
    nbest: Nbest = None,
    lenpen: Lenpen = None,
    set_: DecodeSet = None,
    scores: Annotated[bool, typer.Option(help="Print each hypothesis' score.")] = False,
    input_format: InputFormat = "text",
    document: Annotated[
        bool, typer.Option("--document", help="Same as --input-format document.")
    ] = False,
    srt_cues: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="srt: a sentence running over several cues is translated once and spread "
            "back over them (spread, the default), or each cue is translated alone (alone)."
        ),
    ] = None,
    device: Device = "auto",
    int8: Int8 = False,
    to: To = "",
    frm: From = "",
    attention: Attention = None,
    attention_layer: AttentionLayer = None,
    attention_head: AttentionHead = None,
) -> None:
    """Translate raw text line by line (stdin to stdout by default), or a whole document
    (--document, --input-format srt). Nothing is cut: a line longer than the model takes is
    translated in parts (at its sentences) and joined."""
    from cli.commands.translate import run_translate
    from cli.inference.decoding import decode_overrides
    from cli.inference.heatmaps import attention_options

    overrides = decode_overrides(beam, greedy, nbest, lenpen, set_ or [])
    pictures = attention_options(attention, attention_layer, attention_head)
    input_format = document_format(document, input_format, srt_cues)
    run_translate(
        runs,
        input,
        output,
        overrides,
        device,
        scores,
        attention=pictures,
        int8=int8,
        input_format=input_format,
        to=to,
        frm=frm,
        srt_cues=srt_cues or "spread",
    )


def document_format(document: bool, input_format: str, srt_cues: str | None) -> str:
    """The input format `--document` and `--input-format` name together (`--document` is
    `--input-format document`); `--srt-cues` only with srt."""
    if document and input_format not in ("text", "document"):
        raise InputError(f"--document and --input-format {input_format} contradict; give one")
    chosen = "document" if document else input_format
    if srt_cues is not None and chosen != "srt":
        raise InputError(f"--srt-cues is for --input-format srt, not {chosen}")
    return chosen


@app.command("eval")
@user_errors
def eval_(
    runs: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Argument(help="Run directory or checkpoint file; several: an ensemble."),
    ] = None,
    src: Annotated[Optional[Path], typer.Option(help="Source text to translate.")] = None,  # noqa: UP045
    ref: Annotated[Path, typer.Option(help="Reference translations.")] = ...,
    hyp: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Score this file instead of translating."),
    ] = None,
    beam: Beam = None,
    greedy: Greedy = False,
    lenpen: Lenpen = None,
    set_: DecodeSet = None,
    limit: Annotated[int, typer.Option(help="Score only the first N lines (0: all).")] = 0,
    device: Device = "auto",
    json: Annotated[bool, typer.Option("--json", help="One JSON object for pipelines.")] = False,
    int8: Int8 = False,
    to: To = "",
    frm: From = "",
) -> None:
    """Translate and score with sacrebleu: corpus BLEU and chrF, with signatures."""
    from cli.commands.evaluate import check_hyp_alone, run_eval
    from cli.inference.decoding import decode_overrides

    if limit < 0:
        raise InputError(f"--limit must be 0 (all) or more, got {limit}")
    if hyp is not None:
        given = {"RUN": bool(runs), "--src": src is not None, "--beam": beam is not None}
        given |= {"--greedy": greedy, "--lenpen": lenpen is not None, "--set": bool(set_)}
        check_hyp_alone(given | {"--int8": int8, "--to": bool(to), "--from": bool(frm)})
    overrides = decode_overrides(beam, greedy, None, lenpen, set_ or [])
    typer.echo(run_eval(runs, src, ref, hyp, overrides, device, limit, json, int8, to, frm))


@app.command()
@user_errors
def serve(
    runs: Runs,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    beam: Beam = None,
    set_: DecodeSet = None,
    device: Device = "auto",
    int8: Int8 = False,
    max_lines: Annotated[int, typer.Option(help="Most sentences in one request.")] = 256,
    max_wait: Annotated[
        float, typer.Option(help="Milliseconds a batch waits for other requests to join.")
    ] = 20.0,
    max_queue: Annotated[
        int,
        typer.Option(help="Source tokens x beam that may wait; past it a request gets 503."),
    ] = 65536,
    timeout: Annotated[
        float, typer.Option(help="Seconds a request may take, queue included; then 504.")
    ] = 60.0,
    workers: Annotated[
        int,
        typer.Option(
            help="Searches side by side, sharing the cores (0: up to 4 on CPUs, 1 on GPUs);"
            " on CPUs each in a process with its own copy of the model."
        ),
    ] = 0,
    to: To = "",
    frm: From = "",
) -> None:
    """Translate over HTTP: POST /translate {"text": [...], "beam": 5, "to": "en"}, GET /health,
    a page at /."""
    from cli.commands.serve import Limits, run_serve, wait_seconds
    from cli.inference.decoding import decode_overrides

    overrides = decode_overrides(beam, False, None, None, set_ or [])
    limits = Limits(max_lines, wait_seconds(max_wait), max_queue, timeout, workers)
    run_serve(runs, host, port, overrides, device, int8, limits, to, frm)


@app.command()
@user_errors
def export(
    run: Annotated[str, typer.Argument(help="Run directory or checkpoint file.")],
    to: Annotated[str, typer.Option(help="ctranslate2 or huggingface.")] = ...,
    output: Annotated[Path, typer.Option("-o", "--output", help="The directory to write.")] = ...,
    quantization: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="CTranslate2 weights: int8, int8_float32, float16, ... [float32]."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Replace a non-empty output directory.")] = False,
) -> None:
    """Export for CTranslate2 (`tf translate DIR` runs it) or as a Hugging Face MarianMTModel."""
    from cli.commands.export import run_export

    typer.echo(run_export(run, to, output, quantization, force))


@app.command("import")
@user_errors
def import_(
    source: Annotated[
        str,
        typer.Argument(
            help="A Hugging Face Marian model: its directory, or a hub name "
            "(Helsinki-NLP/opus-mt-es-en).",
            show_default=False,
        ),
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="The run directory to write.")],
    force: Annotated[bool, typer.Option(help="Replace a non-empty output directory.")] = False,
) -> None:
    """Import a pretrained OPUS-MT (Marian) model as a run: translate, fine-tune, export it."""
    from cli.commands.import_model import run_import

    typer.echo(run_import(source, output, force))


@app.command()
@user_errors
def distill(
    teacher: Annotated[
        str, typer.Argument(help="Teacher run, checkpoint or exported CTranslate2 dir.")
    ],
    out: Annotated[Path, typer.Option(help="Folder for train.SRC, train.TGT, distill.json.")],
    beam: Beam = None,
    lenpen: Lenpen = None,
    set_: DecodeSet = None,
    device: Device = "auto",
    corpus: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            help="Translate this corpus's sources instead (repeatable): a spec, or in YAML "
            "{corpus: SPEC, src_lang: .., tgt_lang: .., reverse: .., tag: ..} as data.train "
            "takes it.",
            show_default=False,
        ),
    ] = None,
    to: To = "",
    frm: From = "",
) -> None:
    """Sequence-level distillation data: the teacher translates its training sources."""
    from cli.commands.distill import run_distill
    from cli.inference.decoding import decode_overrides

    overrides = decode_overrides(beam, False, None, lenpen, set_ or [])
    typer.echo(run_distill(teacher, out, overrides, device, corpus or [], to, frm))


@app.command()
@user_errors
def backtranslate(
    run: Annotated[
        str, typer.Argument(help="Reverse run (target to source language), or its CTranslate2 dir.")
    ],
    mono: Annotated[Path, typer.Argument(help="Monolingual text in RUN's source language.")],
    out: Annotated[Path, typer.Option(help="Folder for train.SRC, train.TGT, backtranslate.json.")],
    beam: Beam = None,
    greedy: Greedy = False,
    lenpen: Lenpen = None,
    set_: DecodeSet = None,
    device: Device = "auto",
    to: To = "",
    frm: From = "",
) -> None:
    """Synthetic pairs from monolingual text: a reverse model translates it (resumable)."""
    from cli.commands.backtranslate import run_backtranslate
    from cli.inference.decoding import decode_overrides

    overrides = decode_overrides(beam, greedy, None, lenpen, set_ or [])
    typer.echo(run_backtranslate(run, mono, out, overrides, device, to, frm))


@app.command()
@user_errors
def compare(
    runs: Annotated[list[str], typer.Argument(help="Runs or exported CTranslate2 dirs.")],
    src: Annotated[Path, typer.Option(help="Source text.")] = ...,
    ref: Annotated[Path, typer.Option(help="Reference translations.")] = ...,
    limit: Annotated[int, typer.Option(help="Only the first N lines (0: all).")] = 0,
    device: Device = "auto",
    to: To = "",
    frm: From = "",
) -> None:
    """Models side by side: parameters, BLEU/chrF at beam 5, beam-5 and greedy speed."""
    from cli.commands.compare import run_compare

    if limit < 0:
        raise InputError(f"--limit must be 0 (all) or more, got {limit}")
    typer.echo(run_compare(runs, src, ref, device, limit, to, frm))


@app.command()
@user_errors
def prune(
    run: Annotated[str, typer.Argument(help="Run directory or checkpoint file.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The pruned checkpoint.")] = ...,
    heads: Annotated[int, typer.Option(help="Heads removed from every attention module.")] = 0,
    ffn: Annotated[float, typer.Option(help="Fraction of feed-forward units removed.")] = 0.0,
) -> None:
    """Structured pruning: whole heads and FFN units of smallest norm, a smaller dense model."""
    from cli.commands.prune import run_prune

    typer.echo(run_prune(run, output, heads, ffn))


@app.command()
@user_errors
def average(
    run: Annotated[list[str], typer.Argument(help="A run directory, or checkpoint files.")],
    last: Annotated[int, typer.Option(help="Average the last N step checkpoints of RUN.")] = 5,
    output: Annotated[Path, typer.Option("-o", "--output", help="The averaged checkpoint.")] = ...,
) -> None:
    """Average checkpoints, as the paper does for its results (last 5 for base, 20 for big)."""
    from cli.commands.average import run_average

    typer.echo(run_average(run, last, output))


@app.command()
@user_errors
def plot(
    run: Annotated[Path, typer.Argument(help="Run directory (reads RUN/metrics.jsonl).")],
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("-o", "--output", help="The PNG to write (default: RUN/curves.png)."),
    ] = None,
) -> None:
    """Plot training and validation curves (loss, perplexity, BLEU/chrF, lr) as a PNG."""
    from cli.commands.plot import plot_curves

    typer.echo(plot_curves(run, output or run / "curves.png"))


def main() -> None:
    from cli.device import keep_freed_memory

    keep_freed_memory()
    setup_logging()
    app()


if __name__ == "__main__":
    main()
