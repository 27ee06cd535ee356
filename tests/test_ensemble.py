"""Ensembles: several runs decode as one (the mean of their log-probabilities at each step), in
`tf translate` and `tf eval`, greedy, beam and sampling; one tokenizer for all."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from test_cli import assert_user_error, tf
from test_export import ct2_dir, sharp  # noqa: F401 - fixtures

from cli.inference.decoding import translate_ids
from cli.runs.models import load_for_inference
from model.ensemble import Ensemble

LINES = "el perro come\nla casa grande\nvino a la ciudad\nyo soy\n"
FP32 = ("--set", "decode.precision=fp32")


def translate(*args) -> list[str]:
    result = tf("translate", *args, *FP32, "--scores", input=LINES)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def split(lines: list[str]) -> tuple[list[str], list[float]]:
    """Texts and scores of `text\tscore` or n-best `k ||| text ||| score` lines."""
    if " ||| " in lines[0]:
        parts = [line.split(" ||| ") for line in lines]
        return [p[1] for p in parts], [float(p[2]) for p in parts]
    texts, scores = zip(*(line.rsplit("\t", 1) for line in lines))
    return list(texts), [float(s) for s in scores]


@pytest.mark.parametrize(
    "search",
    [
        ("--greedy",),
        ("--beam", "3", "--nbest", "2"),
        ("--greedy", "--set", "decode.sampling_topk=-1"),
    ],
)
def test_an_ensemble_of_a_model_with_itself_is_that_model(sharp, search):  # noqa: F811
    alone_texts, alone_scores = split(translate(sharp, *search))
    texts, scores = split(translate(sharp, sharp, *search))
    assert texts == alone_texts
    assert scores == pytest.approx(alone_scores, abs=1e-4)


def member_log_probs(model, ids: list[int], tokens: list[int], bos: int) -> torch.Tensor:
    """(T + 1, V): a member's next-token log-probabilities along BOS + tokens, teacher-forced."""
    no_pad = torch.zeros(1, len(ids), dtype=torch.bool)
    with torch.no_grad():
        memory = model.encode(torch.tensor([ids]), no_pad)
        hidden = model.decode(torch.tensor([[bos, *tokens]]), memory, no_pad, None)
        return model.generator(hidden).float().log_softmax(-1)[0]


def test_an_ensemble_decodes_with_the_mean_of_its_members_log_probabilities(trained, sharp):  # noqa: F811
    cpu = torch.device("cpu")
    a, tok, config = load_for_inference(trained, cpu)
    b, _, _ = load_for_inference(sharp, cpu)
    src = tok.encode_src(LINES.splitlines())
    decode = replace(config.decode, beam_size=1, precision="fp32", max_len_a=0.0, max_len_b=6)
    hyps = translate_ids(Ensemble([a, b]), tok, src, decode, cpu)
    for ids, (h,) in zip(src, hyps):
        mean = (
            member_log_probs(a, ids, h.tokens, tok.bos_id)
            + member_log_probs(b, ids, h.tokens, tok.bos_id)
        ) / 2
        steps = mean.log_softmax(-1)  # the search normalises each step's mean
        chosen = steps.argmax(-1)  # greedy: each token the ensemble's most probable
        assert chosen[: len(h.tokens)].tolist() == h.tokens
        ends = torch.tensor([*h.tokens, tok.eos_id])  # every hypothesis ends in EOS
        expected = float(steps[torch.arange(len(ends)), ends].sum())
        assert h.log_prob == pytest.approx(expected, abs=1e-4)
        # Not either member's own log-probability: both count.
        for member in (a, b):
            own = member_log_probs(member, ids, h.tokens, tok.bos_id)
            assert float(own[torch.arange(len(ends)), ends].sum()) != pytest.approx(
                expected, abs=1e-2
            )


def test_tf_eval_scores_an_ensemble_of_checkpoints(trained, tiny_prefix):
    ckpts = sorted((trained / "checkpoints").glob("step_*.pt"))
    assert len(ckpts) == 2
    args = [
        "--src",
        f"{tiny_prefix}.es",
        "--ref",
        f"{tiny_prefix}.en",
        "--limit",
        "10",
        "--json",
        "--greedy",
        *FP32,
    ]
    result = tf("eval", *ckpts, *args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sentences"] == 10


def test_members_must_share_a_tokenizer_and_be_runs(trained, ct2_dir, tiny_prefix, tmp_path):  # noqa: F811
    other = tmp_path / "other"
    sets = [
        f"data.train={tiny_prefix}",
        f"data.dev={tiny_prefix}-dev",
        "data.vocab_size=90",
        "train.max_steps=1",
    ]
    result = tf("train", "tiny", "--out", other, *[a for s in sets for a in ("--set", s)])
    assert result.exit_code == 0, result.output
    assert_user_error(
        tf("translate", trained, other, input="hola\n"),
        f"{other}: its tokenizer is not {trained}'s",
    )
    assert_user_error(
        tf("translate", trained, ct2_dir, input="hola\n"),
        f"{ct2_dir}: CTranslate2 decodes one model",
    )
