"""`tf plot` and `tf translate --attention` on a tiny trained run: PNGs, attention rows, errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close
from typer.testing import CliRunner

from cli.commands.plot import read_metrics
from cli.inference.heatmaps import attention_matrix
from cli.main import app
from cli.runs.models import load_for_inference
from data.batching import collate
from data.errors import InputError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SENTENCES = [
    "Y dijo Dios: Sea la luz.",
    "En el principio crió Dios los cielos y la tierra.",
]
runner = CliRunner()


def tf(*args: object, input: str | None = None):
    return runner.invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def model_and_tokenizer(trained):
    model, tokenizer, _ = load_for_inference(trained, torch.device("cpu"))
    return model, tokenizer


def assert_png(path: Path, min_height: int, min_width: int) -> None:
    """A PNG file that matplotlib reads back as an image of at least this many pixels."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE, path
    pixels = matplotlib.image.imread(path)  # (height, width, RGBA)
    assert pixels.ndim == 3 and pixels.shape[0] >= min_height and pixels.shape[1] >= min_width
    assert pixels.std() > 0.01  # something was drawn


def assert_user_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, err


# --- tf plot ------------------------------------------------------------------------------------


def test_plot_writes_a_png_of_the_curves(trained, tmp_path):
    out = tmp_path / "figures" / "curves.png"
    result = tf("plot", trained, "-o", out)
    assert result.exit_code == 0, result.output
    assert_png(out, 600, 1000)  # 12 x 8 inches at 100 dpi
    train, dev = read_metrics(trained / "metrics.jsonl")
    assert [r["step"] for r in dev] == [3, 6] and train and all("lr" in r for r in train)


def test_plot_missing_metrics_is_a_one_line_error(tmp_path):
    assert_user_error(tf("plot", tmp_path, "-o", tmp_path / "c.png"), "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text("")
    assert_user_error(tf("plot", tmp_path, "-o", tmp_path / "c.png"), "metrics.jsonl", "no")
    assert not (tmp_path / "c.png").exists()


def test_read_metrics_skips_a_cut_last_line_but_not_a_bad_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    train = '{"step": 5, "loss": 4.0, "nll": 3.5, "ppl": 33.0, "lr": 0.001}\n'
    dev = '{"step": 10, "dev_loss": 3.9, "dev_ppl": 30.0, "dev_bleu": 1.0, "dev_chrf": 9.0}\n'
    path.write_text(train + dev + '{"step": 15, "lo')  # killed while writing
    assert read_metrics(path) == (
        [{"step": 5, "loss": 4.0, "nll": 3.5, "ppl": 33.0, "lr": 0.001}],
        [{"step": 10, "dev_loss": 3.9, "dev_ppl": 30.0, "dev_bleu": 1.0, "dev_chrf": 9.0}],
    )
    path.write_text(train + "not json\n" + dev)
    with pytest.raises(InputError, match="metrics.jsonl:2"):
        read_metrics(path)


# --- tf translate --attention --------------------------------------------------------------------


def test_translate_attention_writes_one_png_per_non_empty_line(trained, tmp_path):
    text = f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n   \n"
    pictures = tmp_path / "attention"
    result = tf("translate", trained, "--greedy", "--attention", pictures, input=text)
    assert result.exit_code == 0, result.output
    assert result.stdout == tf("translate", trained, "--greedy", input=text).stdout
    assert sorted(p.name for p in pictures.iterdir()) == ["0001.png", "0003.png"]
    for path in pictures.iterdir():
        assert_png(path, 250, 350)


def test_translate_attention_one_head_of_one_layer(trained, tmp_path):
    pictures = tmp_path / "one"
    args = ("--attention", pictures, "--attention-layer", "0", "--attention-head", "3")
    result = tf("translate", trained, "--greedy", *args, input=SENTENCES[0] + "\n")
    assert result.exit_code == 0, result.output
    assert [p.name for p in pictures.iterdir()] == ["0001.png"]


def test_translate_attention_bad_layer_or_head(trained, tmp_path):
    text = SENTENCES[0] + "\n"
    layer = tf("translate", trained, "--attention", tmp_path, "--attention-layer", "2", input=text)
    assert_user_error(layer, "--attention-layer 2", "2 decoder layers")
    head = tf("translate", trained, "--attention", tmp_path, "--attention-head", "4", input=text)
    assert_user_error(head, "--attention-head 4", "4 heads")


def test_cross_attention_rows_sum_to_one_and_skip_padding(model_and_tokenizer):
    model, tok = model_and_tokenizer
    src_ids = tok.encode_src(["Sea la luz.", SENTENCES[1]])
    tgt_ids = tok.encode_tgt(["Let there be light.", "God"])
    batch = collate(src_ids, tgt_ids, tok.pad_id, tok.bos_id, tok.eos_id, [0, 1])
    assert batch.src_pad_mask.any()  # sentences of different lengths: some padding
    with torch.no_grad():
        probabilities = model.cross_attention(
            batch.src, batch.tgt_in, batch.src_pad_mask, batch.tgt_pad_mask
        )  # (L, B, H, T, S)
    L, B, H, T, S = probabilities.shape
    assert (L, B, H, T, S) == (2, 2, 4, batch.tgt_in.size(1), batch.src.size(1))
    real_rows = probabilities.permute(1, 3, 0, 2, 4)[~batch.tgt_pad_mask]  # (rows, L, H, S)
    assert_close(real_rows.sum(-1), torch.ones_like(real_rows.sum(-1)))
    on_padding = batch.src_pad_mask[None, :, None, None, :].expand_as(probabilities)
    assert (probabilities[on_padding] == 0).all()


def test_attention_matrix_selects_a_head_or_averages(model_and_tokenizer):
    model, tok = model_and_tokenizer
    src_ids = tok.encode_src([SENTENCES[0]])[0]
    hyp = tok.encode_tgt(["And God said, Let there be light"])[0]
    src = torch.tensor([src_ids])
    tgt_in = torch.tensor([[tok.bos_id, *hyp]])
    with torch.no_grad():
        every = model.cross_attention(src, tgt_in, torch.zeros_like(src, dtype=torch.bool), None)
    last = every[-1, 0]  # (H, T, S)

    mean, src_pieces, tgt_pieces = attention_matrix(model, tok, src_ids, hyp)
    assert mean.shape == (len(hyp) + 1, len(src_ids))
    assert src_pieces == tok.src_pieces(SENTENCES[0])
    assert tgt_pieces[:-1] == tok.tgt_pieces(hyp) and tgt_pieces[-1] == "</s>"
    np.testing.assert_allclose(mean, last.mean(0).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(mean.sum(-1), np.ones(len(hyp) + 1), rtol=1e-5, atol=1e-5)
    for head in range(last.size(0)):
        one, _, _ = attention_matrix(model, tok, src_ids, hyp, layer=-1, head=head)
        np.testing.assert_allclose(one, last[head].numpy(), rtol=1e-6, atol=1e-6)
    first, _, _ = attention_matrix(model, tok, src_ids, hyp, layer=0, head=1)
    np.testing.assert_allclose(first, every[0, 0, 1].numpy(), rtol=1e-6, atol=1e-6)


# --- without matplotlib --------------------------------------------------------------------------


def test_missing_matplotlib_is_a_clear_error(trained, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    plot = tf("plot", trained, "-o", tmp_path / "c.png")
    assert_user_error(plot, "matplotlib is needed for tf plot", "pip install 'tf[plot]'")
    text = SENTENCES[0] + "\n"
    translate = tf("translate", trained, "--attention", tmp_path / "a", input=text)
    assert_user_error(translate, "matplotlib is needed for tf translate --attention")
    assert not (tmp_path / "c.png").exists()
