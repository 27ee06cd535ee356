"""Random sampling (top-k, top-p, temperature): draws that follow the cut distribution, samples
that depend on their seed and sentence only, top-k 1 that is greedy, on both engines."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_cli import assert_user_error, tf
from test_export import ct2_dir, sharp  # noqa: F401 - fixtures
from test_search import BOS, EOS, PAD, tiny_model

from cli.config import DecodeConfig
from cli.inference.decoding import search_batch
from data.batching import collate
from model.search import Sampling, sample_tokens


def grid(n: int) -> torch.Tensor:
    """n evenly spaced uniforms: inverse-CDF draws at them hit each token in proportion."""
    return (torch.arange(n, dtype=torch.float64) + 0.5) / n


def draw_counts(log_probs: torch.Tensor, sampling: Sampling, n: int = 10_000) -> torch.Tensor:
    tokens = sample_tokens(log_probs.expand(n, -1), grid(n), sampling)
    return torch.bincount(tokens, minlength=log_probs.size(-1)).double() / n


PROBS = torch.tensor([[0.05, 0.4, 0.3, 0.15, 0.1]], dtype=torch.float64)


def test_draws_follow_the_distribution_cut_to_top_k_and_top_p():
    log_probs = PROBS.log()
    assert draw_counts(log_probs, Sampling(-1)) == pytest.approx(PROBS[0], abs=1e-3)
    top2 = torch.tensor([0, 0.4, 0.3, 0, 0], dtype=torch.float64) / 0.7
    assert draw_counts(log_probs, Sampling(2)) == pytest.approx(top2, abs=1e-3)
    # Top-p 0.75: 0.4 + 0.3 = 0.7 is short of it, so 0.15 joins; 0.1 and 0.05 never come.
    nucleus = torch.tensor([0, 0.4, 0.3, 0.15, 0], dtype=torch.float64) / 0.85
    assert draw_counts(log_probs, Sampling(-1, topp=0.75)) == pytest.approx(nucleus, abs=1e-3)
    # Top-p below the most probable token's mass still keeps that one token.
    assert draw_counts(log_probs, Sampling(-1, topp=0.1)).tolist() == [0, 1, 0, 0, 0]
    cooled = F.softmax(log_probs / 0.5, dim=-1)[0]
    assert draw_counts(log_probs, Sampling(-1, temperature=0.5)) == pytest.approx(cooled, abs=1e-3)


def test_forbidden_tokens_are_never_drawn_and_top_k_1_is_the_argmax():
    log_probs = PROBS.log().masked_fill(torch.tensor([False, True, False, False, True]), -1e30)
    log_probs[0, 1] = float("-inf")
    counts = draw_counts(log_probs, Sampling(-1))
    assert counts[1] == 0 and counts[4] == 0 and counts.sum() == pytest.approx(1)
    only_eos = torch.full((3, 5), float("-inf"))
    only_eos[:, EOS] = 0.0
    assert (
        sample_tokens(only_eos, torch.tensor([0.0, 0.5, 0.999]), Sampling(3)).tolist() == [EOS] * 3
    )
    u = torch.rand(4)
    random_log_probs = torch.randn(4, 9).log_softmax(-1)
    assert torch.equal(
        sample_tokens(random_log_probs, u, Sampling(1)), random_log_probs.argmax(dim=1)
    )


def model_batch():
    g = torch.Generator().manual_seed(7)
    lengths = [6, 3, 5, 2, 4]
    rows = [torch.randint(4, 40, (n,), generator=g).tolist() for n in lengths]
    return rows, collate(rows, None, PAD, BOS, EOS, list(range(len(rows))))


def decode(**settings) -> DecodeConfig:
    return DecodeConfig(**{"max_len_a": 0.0, "max_len_b": 8, "precision": "fp32", **settings})


@torch.no_grad()
def test_a_sample_depends_on_its_seed_and_sentence_only():
    model = tiny_model()
    rows, batch = model_batch()
    settings = decode(sampling_topk=-1, beam_size=3, nbest=3, seed=1)
    first = search_batch(model, batch, settings, BOS, EOS)
    assert first == search_batch(model, batch, settings, BOS, EOS)
    # Each sentence alone, in another batch: the same samples.
    for row, hyps in zip(rows, first):
        alone = collate([row], None, PAD, BOS, EOS, [0])
        (again,) = search_batch(model, alone, settings, BOS, EOS)
        assert [h.tokens for h in again] == [h.tokens for h in hyps]
        assert [h.score for h in again] == pytest.approx([h.score for h in hyps])
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    other = search_batch(
        model, batch, decode(sampling_topk=-1, beam_size=3, nbest=3, seed=2), BOS, EOS
    )
    assert [[h.tokens for h in n] for n in other] != [[h.tokens for h in n] for n in first]
    # Three samples of a sentence are not one sample thrice.
    assert any(len({tuple(h.tokens) for h in n}) > 1 for n in first)


@torch.no_grad()
def test_top_k_1_samples_are_greedy():
    model = tiny_model()
    _, batch = model_batch()
    greedy = search_batch(model, batch, decode(beam_size=1), BOS, EOS)
    sampled = search_batch(model, batch, decode(beam_size=1, sampling_topk=1, seed=5), BOS, EOS)
    # The same tokens and log-probabilities (the score of a sample carries the length penalty
    # that ranks a sentence's samples; greedy's is its log-probability).
    assert [[(h.tokens, h.log_prob) for h in n] for n in sampled] == [
        [(h.tokens, h.log_prob) for h in n] for n in greedy
    ]
    assert len({len(n[0].tokens) for n in greedy}) > 1


def test_sampling_keeps_the_length_rules():
    model = tiny_model()
    _, batch = model_batch()
    with torch.no_grad():
        hyps = search_batch(
            model,
            batch,
            decode(sampling_topk=-1, beam_size=4, nbest=4, min_len=3, max_len_b=5),
            BOS,
            EOS,
        )
    lengths = [len(h.tokens) for n in hyps for h in n]
    assert min(lengths) >= 3 and max(lengths) <= 5


LINES = "el perro come\nla casa grande\nvino a la ciudad\nyo soy\n"


def translate(run, *args: str) -> list[str]:
    result = tf("translate", run, "--set", "decode.precision=fp32", *args, input=LINES)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def sampled(run, seed: int, *args: str) -> list[str]:
    sets = ["--set", "decode.sampling_topk=-1", "--set", f"decode.seed={seed}"]
    return translate(run, "--greedy", *sets, *args)


def test_tf_translate_samples_by_seed_and_top_k_1_is_greedy(trained):
    first = sampled(trained, 1)
    assert len(first) == 4
    assert sampled(trained, 1) == first
    assert sampled(trained, 2) != first
    assert sampled(trained, 1, "--set", "decode.sampling_topk=1") == translate(trained, "--greedy")


def test_ctranslate2_samples_by_seed_and_top_k_1_is_its_greedy(ct2_dir):  # noqa: F811
    hot = ["--set", "decode.sampling_temperature=5"]  # the sharp model's samples would agree
    first = sampled(ct2_dir, 1, *hot)
    assert sampled(ct2_dir, 1, *hot) == first
    assert sampled(ct2_dir, 2, *hot) != first
    assert sampled(ct2_dir, 1, "--set", "decode.sampling_topk=1") == translate(ct2_dir, "--greedy")
    nbest = translate(
        ct2_dir, "--beam", "3", "--nbest", "3", "--scores", "--set", "decode.sampling_topk=-1", *hot
    )
    assert len(nbest) == 12


@pytest.mark.parametrize(
    "setting, fragment",
    [
        ("decode.sampling_topp=0", "decode.sampling_topp must be in (0, 1], got 0"),
        ("decode.sampling_topk=-2", "decode.sampling_topk must be -1 (all), 0 (off) or above"),
        ("decode.sampling_temperature=0", "decode.sampling_temperature must be in (0, 100]"),
        ("decode.sampling_temperature=0.5", "which is off (decode.sampling_topk 0)"),
    ],
)
def test_bad_sampling_settings_are_one_line_errors(trained, setting, fragment):
    assert_user_error(tf("translate", trained, "--set", setting, input="hola\n"), fragment)
