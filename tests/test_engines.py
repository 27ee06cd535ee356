"""Engines: every decode setting checked against the device and engine when the engine is
loaded (before a first sentence or request), and CTranslate2 run on the device, in the
precision and with the scores that `tf`'s own engine has."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_cli import assert_user_error, tf
from test_ensemble import split
from test_export import SENTENCES, ct2_dir, ending, exported, sharp  # noqa: F401 - fixtures

from cli.inference.engines import load_engine
from data.errors import InputError

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ("decode.patience=0", "CTranslate2 needs a patience above 0"),
        ("decode.precision=fp16", "decode.precision=fp16: CTranslate2 on cpu computes in"),
    ],
)
def test_ctranslate2_settings_that_cannot_work_fail_at_load(ct2_dir, setting, fragment):  # noqa: F811
    with pytest.raises(InputError, match=fragment):
        load_engine(str(ct2_dir), CPU, [setting])
    # Before any line is read: with no input at all, the command still refuses.
    assert_user_error(tf("translate", ct2_dir, "--set", setting, input=""), fragment)


def test_pytorch_settings_that_cannot_work_fail_at_load(sharp):  # noqa: F811
    with pytest.raises(InputError, match="fp16 needs a CUDA device"):
        load_engine(str(sharp), CPU, ["decode.precision=fp16"])
    empty = tf("translate", sharp, "--set", "decode.precision=fp16", input="")
    assert_user_error(empty, "fp16 needs a CUDA device")
    load_engine(str(sharp), CPU, ["decode.precision=fp16"], int8=True)  # int8 computes in fp32


class FakeTranslator:
    """Records how CTranslate2 was asked to load the model."""

    made: list[dict] = []

    def __init__(self, path: str, **options) -> None:
        FakeTranslator.made.append(options)


@pytest.mark.parametrize(
    "precision, compute_type",
    [("auto", "default"), ("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16")],
)
def test_ctranslate2_runs_on_the_device_index_in_the_precision(
    ct2_dir,  # noqa: F811
    monkeypatch,
    precision,
    compute_type,
):
    import ctranslate2

    asked = []

    def supported(device: str, index: int = 0) -> set[str]:
        asked.append((device, index))
        return {"float32", "float16", "bfloat16", "int8"}

    monkeypatch.setattr(ctranslate2, "Translator", FakeTranslator)
    monkeypatch.setattr(ctranslate2, "get_supported_compute_types", supported)
    FakeTranslator.made.clear()
    load_engine(str(ct2_dir), torch.device("cuda:1"), [f"decode.precision={precision}"])
    (options,) = FakeTranslator.made
    assert options["device"] == "cuda" and options["device_index"] == 1
    assert options["compute_type"] == compute_type
    assert precision == "auto" or asked == [("cuda", 1)]  # checked on that very device


LINES = [
    *SENTENCES,
    "La tierra",
    "Y fue la tarde y la mañana el día primero.",
    "Y llamó Dios a la luz Día, y a las tinieblas llamó Noche.",
]


@pytest.fixture(scope="module")
def ending_ct2(ending, tmp_path_factory):  # noqa: F811
    return ending, exported(ending, "ctranslate2", tmp_path_factory)


def hypotheses(run, settings: list[str]) -> list[dict[tuple, object]]:
    """Each line's hypotheses by their tokens."""
    engine = load_engine(str(run), CPU, settings)
    return [{tuple(h.tokens): h for h in hyps} for _, hyps in engine.stream(LINES, "test")]


@pytest.mark.parametrize("lenpen", [0.0, 0.6, 1.0])
def test_ctranslate2_scores_mean_what_tfs_mean(ending_ct2, lenpen):
    """Greedy: the sum of the log-probabilities, EOS included, whatever the length penalty;
    beam search: GNMT's score of that sum (compared where both engines found the same output:
    their searches differ when the penalty is not 0). Outputs that end and outputs cut at the
    length limit (where tf forces an EOS) alike."""
    run, ct2 = ending_ct2
    common = [f"decode.length_penalty={lenpen}", "decode.precision=fp32", "decode.min_len=1"]
    lengths = set()
    for search in (["decode.beam_size=1"], ["decode.beam_size=3", "decode.nbest=3"]):
        ours, theirs = hypotheses(run, search + common), hypotheses(ct2, search + common)
        same = [
            (mine[t], other[t]) for mine, other in zip(ours, theirs) for t in mine if t in other
        ]
        assert len(same) >= len(LINES)
        for a, b in same:
            assert math.isclose(a.log_prob, b.log_prob, abs_tol=1e-3), (search, a, b)
            assert math.isclose(a.score, b.score, abs_tol=1e-3), (search, a, b)
        lengths |= {len(a.tokens) for a, _ in same}
    assert min(lengths) < 10 and max(lengths) > 30  # some ended, some were cut at the limit
    # What --scores prints is then the same number, to the tolerance above: the two engines sum
    # in other orders (CTranslate2 on its own threads), and a printed digit (4 decimals) may
    # round either way of a boundary. The texts are the same exactly.
    args = ["--scores", "--greedy", "--lenpen", str(lenpen)]
    text = "\n".join(LINES) + "\n"
    ours_cli = tf("translate", run, *args, "--set", "decode.precision=fp32", input=text)
    theirs_cli = tf("translate", ct2, *args, input=text)
    assert theirs_cli.exit_code == 0, theirs_cli.output
    ours_texts, ours_scores = split(ours_cli.stdout.splitlines())
    theirs_texts, theirs_scores = split(theirs_cli.stdout.splitlines())
    assert theirs_texts == ours_texts
    assert theirs_scores == pytest.approx(ours_scores, abs=1e-3)


def test_ctranslate2_nbest_comes_best_first_by_tfs_score():
    """CTranslate2 ranks by log P / len ** alpha, tf by GNMT's log P / ((5 + len) / 6) ** alpha:
    the n-best list is put in tf's order, as its printed scores say."""
    from dataclasses import replace

    from cli.config import Config
    from cli.inference.engines import translate_ids_ct2

    class Translator:  # (6 tokens + EOS, log P -4.0) beats (1 + EOS, -1.0) by |Y| ** alpha
        def translate_batch(self, sources, **options):
            alpha = options["length_penalty"]
            hyps, scores = [["a"] * 6, ["a"]], [-4.0 / 7**alpha, -1.0 / 2**alpha]
            return [SimpleNamespace(hypotheses=hyps, scores=scores) for _ in sources]

    tok = SimpleNamespace(src_id_pieces=lambda ids: ids, tgt_piece_ids=lambda p: [5] * len(p))
    config = Config()
    config = replace(config, decode=replace(config.decode, beam_size=2, nbest=2, length_penalty=1))
    (hyps,) = translate_ids_ct2(Translator(), tok, [[7, 8]], config)
    assert [h.log_prob for h in hyps] == pytest.approx([-1.0, -4.0])  # the sums, recovered
    assert [h.score for h in hyps] == pytest.approx([-1.0 / (7 / 6), -4.0 / (12 / 6)])


@pytest.mark.parametrize("beam", [3, 5])
def test_ctranslate2_beam_search_is_tfs_where_outputs_are_cut(ending_ct2, beam):
    """With the length penalty off, CTranslate2's beam search finds tf's best output, those cut
    at the length limit included: it ranks them without the EOS that tf forces there, so the
    engine re-scores every hypothesis of the beam, not only the n-best it ranked first."""
    run, ct2 = ending_ct2
    settings = [f"decode.beam_size={beam}", "decode.length_penalty=0", "decode.min_len=1"]
    settings.append("decode.precision=fp32")
    ours, theirs = hypotheses(run, settings), hypotheses(ct2, settings)
    best = [max(found.values(), key=lambda h: h.score) for found in ours]
    other = [max(found.values(), key=lambda h: h.score) for found in theirs]
    assert [h.tokens for h in other] == [h.tokens for h in best]
    assert any(len(h.tokens) > 30 for h in best)  # some were cut at the limit


def test_ctranslate2_returns_what_a_patience_below_1_allows(ending_ct2):
    """CTranslate2 returns at most beam x patience hypotheses, rounded half up (more is its
    ValueError): the engine asks for no more, and an nbest past them is refused at load."""
    run, ct2 = ending_ct2
    text = "\n".join(LINES) + "\n"
    half = ["--beam", "5", "--set", "decode.patience=0.5"]
    three = tf("translate", ct2, *half, "--nbest", "3", input=text)
    assert three.exit_code == 0, three.output
    assert len(three.stdout.splitlines()) == 3 * len(LINES)
    refused = tf("translate", ct2, *half, "--nbest", "4", input=text)
    assert_user_error(refused, "decode.nbest 4: CTranslate2 returns at most", "(5 x 0.5)")


def test_an_engine_says_what_it_is_and_what_it_can_do(sharp, ct2_dir):  # noqa: F811
    """`Engine.kind` and its capabilities, where code had asked "is there a PyTorch model":
    tf's own model keeps constraints and draws attention (not in int8, not as an ensemble);
    CTranslate2 keeps no constraints, runs its own threads and says no parameter count."""
    run = load_engine(str(sharp), CPU, [])
    assert (run.kind, run.label, run.int8, run.ensemble) == ("pytorch", "pytorch", False, False)
    assert run.constraints and run.attention_heatmaps and not run.own_threads
    assert run.parameters == run.model.num_parameters() > 0
    int8 = load_engine(str(sharp), CPU, [], int8=True)
    assert (int8.kind, int8.label, int8.int8) == ("pytorch", "pytorch-int8", True)
    assert int8.constraints and not int8.attention_heatmaps
    both = load_engine([str(sharp), str(sharp)], CPU, [])
    assert both.ensemble and both.constraints and not both.attention_heatmaps
    ct2 = load_engine(str(ct2_dir), CPU, [])
    assert (ct2.kind, ct2.label, ct2.parameters) == ("ctranslate2", "ctranslate2", 0)
    assert not ct2.constraints and not ct2.attention_heatmaps and ct2.own_threads
