"""`tf plot`: a run's training and validation curves, read from RUN/metrics.jsonl, as one PNG
(matplotlib needed: `pip install 'tf[plot]'`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.figures import new_figure
from data.errors import InputError

if TYPE_CHECKING:
    from matplotlib.axes import Axes

Record = dict[str, Any]

TRAIN_STYLE = dict(linewidth=1.2)
DEV_STYLE = dict(marker="o", markersize=4, linewidth=1.2)  # few points: show each one
DIRECTION_STYLE = dict(marker=".", markersize=3, linewidth=0.8, linestyle="--")  # multilingual


def read_metrics(path: Path) -> tuple[list[Record], list[Record]]:
    """Split a metrics file into training log records and validation records, in file order.

    Args:
        path: RUN/metrics.jsonl, one JSON object per line.

    Returns:
        (train, dev): records with a `loss` key (step, epoch, loss, nll, ppl, lr, ...) and records
        with a `dev_loss` key (step, epoch, dev_loss, dev_nll, dev_ppl, dev_bleu, dev_chrf, ...).

    Raises:
        InputError: no such file, no records in it, or a line that is not a record.
    """
    if not path.is_file():
        raise InputError(f"{path}: no metrics file (has this run trained yet?)")
    lines = path.read_text(encoding="utf-8").splitlines()
    train: list[Record] = []
    dev: list[Record] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if n == len(lines):  # a run killed while writing leaves its last line cut short
                break
            raise InputError(f"{path}:{n}: not a JSON record") from None
        if not isinstance(record, dict) or "step" not in record:
            raise InputError(f"{path}:{n}: not a metrics record (no 'step')")
        if "dev_loss" in record:
            dev.append(record)
        elif "loss" in record:
            train.append(record)
    if not train and not dev:
        raise InputError(f"{path}: no metrics records yet")
    return train, dev


def plot_curves(run_dir: Path, out_png: Path) -> Path:
    """Draw a run's curves into one PNG of four panels, all against the training step.

    Panels: loss (train label-smoothed loss and NLL, dev loss); perplexity (train and dev, log
    scale); dev BLEU and chrF (a multilingual run's per direction too); learning rate.

    Args:
        run_dir: the run directory, holding metrics.jsonl.
        out_png: the picture to write (its folder is created).

    Returns:
        out_png.
    """
    from cli.runs.run_dir import RunDir
    from data.files import atomic_output, check_output

    check_output(out_png)
    train, dev = read_metrics(RunDir(run_dir).metrics)
    figure = new_figure(12, 8, "tf plot")
    (loss, ppl), (scores, lr) = figure.subplots(2, 2, sharex=True)
    draw_series(
        loss,
        "loss (nats/token)",
        [
            (train, "loss", "train loss (label-smoothed)", TRAIN_STYLE),
            (train, "nll", "train NLL", TRAIN_STYLE),
            (dev, "dev_loss", "dev loss (label-smoothed)", DEV_STYLE),
            (dev, "watched_loss", "watched directions' dev loss", DEV_STYLE),
        ],
    )
    draw_series(
        ppl,
        "perplexity",
        [
            (train, "ppl", "train", TRAIN_STYLE),
            (dev, "dev_ppl", "dev", DEV_STYLE),
            (dev, "watched_ppl", "dev, watched directions", DEV_STYLE),
        ],
    )
    ppl.set_yscale("log")
    draw_scores(scores, dev)
    draw_series(lr, "learning rate", [(train, "lr", "lr", TRAIN_STYLE)])
    lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for axes in (scores, lr):
        axes.set_xlabel("step")
    name = Path(run_dir).resolve().name
    figure.suptitle(f"{name}: {len(train)} training logs, {len(dev)} validations")
    with atomic_output(out_png, "wb") as f:
        figure.savefig(f, dpi=100, format="png")
    return out_png


def draw_scores(axes: Axes, dev: list[Record]) -> None:
    """Dev BLEU and chrF: the mean that best.pt follows, a multilingual run's directions each,
    and the mean of the watched ones (directions no corpus trains: forgetting), where logged."""
    directions = list(dict.fromkeys(k.split("/", 1)[1] for r in dev for k in r if "/" in k))
    if any("watched_bleu" in r for r in dev):
        mean = " (mean of the trained directions)"
    else:
        mean = " (mean of the directions)" if directions else ""
    scores = (("bleu", "BLEU"), ("chrf", "chrF"))
    draw_series(
        axes,
        "dev BLEU / chrF",
        [(dev, f"dev_{name}", f"{label}{mean}", DEV_STYLE) for name, label in scores]
        + [
            (dev, f"watched_{name}", f"{label} (mean of the watched directions)", DEV_STYLE)
            for name, label in scores
        ]
        + [
            (dev, f"dev_{name}/{d}", f"{label} {d}", DIRECTION_STYLE)
            for d in directions
            for name, label in scores
        ],
    )


def draw_series(
    axes: Axes, ylabel: str, series: list[tuple[list[Record], str, str, dict[str, Any]]]
) -> None:
    """Plot each (records, key, label, style) that has values; say so when none has any."""
    drawn = 0
    for records, key, label, style in series:
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            steps, values = zip(*points)
            if len(points) == 1:  # a line through one point draws nothing
                style = {**style, "marker": "o"}
            axes.plot(steps, values, label=label, **style)
            drawn += 1
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    if drawn:
        axes.legend(loc="best", fontsize=9)
    else:
        axes.text(0.5, 0.5, "no records yet", ha="center", va="center", transform=axes.transAxes)
