"""Target prefixes and lexical constraints: hand-made steps and a tiny model for the searches,
`tf translate --input-format jsonl` on both engines for the whole path."""

from __future__ import annotations

import json

import pytest
import torch
from test_cli import assert_user_error, tf
from test_export import ct2_dir, sharp  # noqa: F401 - fixtures
from test_search import DEFAULTS, hand_settings, random_step, reorder_rows, start

from model.search import (
    Progress,
    Sampling,
    beam_search,
    constrained_beam_search,
    greedy_search,
    sample_search,
)


def contains(tokens: list[int], phrase: tuple[int, ...]) -> bool:
    n = len(phrase)
    return any(tuple(tokens[i : i + n]) == phrase for i in range(len(tokens) - n + 1))


def run(search, step, max_lens, beam_size, *batch, **options):
    """`search` (beam or constrained beam) over a hand-made step, from a fresh state, with
    the batch's own arguments after its max lengths (constraints, prefix)."""
    return search(
        step,
        start(len(max_lens)),
        reorder_rows,
        hand_settings(beam_size=beam_size, **{**DEFAULTS, **options}),
        torch.tensor(max_lens),
        *batch,
    )


def run_constrained(step, constraints, max_lens, beam_size, prefix=None, **options):
    return run(constrained_beam_search, step, max_lens, beam_size, constraints, prefix, **options)


def run_beam(step, max_lens, beam_size, prefix=None, **options):
    return run(beam_search, step, max_lens, beam_size, prefix, **options)


@pytest.mark.parametrize(
    "beam_size, options",
    [(1, {}), (3, {"nbest": 2}), (4, {"length_penalty": 1.0, "patience": 0.0})],
)
def test_without_constraints_it_is_beam_search(beam_size, options):
    step, max_lens = random_step(vocab_size=7), [1, 4, 6, 3, 8, 5]
    expected = run_beam(step, max_lens, beam_size, **options)
    assert run_constrained(step, [()] * 6, max_lens, beam_size, **options) == expected


@pytest.mark.parametrize("beam_size", [1, 2, 5])
def test_every_output_holds_every_constraint(beam_size):
    step = random_step(vocab_size=8, eos_growth=1.5)  # the model would stop early
    constraints = [((4, 5),), ((6,), (1, 7)), ((7, 7, 4),), ((5,), (5,)), ()]
    max_lens = [6, 7, 5, 4, 6]
    nbest = min(2, beam_size)
    found = run_constrained(step, constraints, max_lens, beam_size, nbest=nbest)
    for hyps, phrases, max_len in zip(found, constraints, max_lens):
        assert len(hyps) == nbest
        for h in hyps:
            assert len(h.tokens) <= max_len
            for phrase in phrases:
                assert contains(h.tokens, phrase), (h.tokens, phrases)
            if phrases == ((5,), (5,)):  # a phrase given twice must appear twice
                assert h.tokens.count(5) >= 2
    plain = run_beam(step, max_lens, beam_size, nbest=nbest)
    assert found[-1] == plain[-1]  # a sentence without constraints searches as usual
    assert not all(contains(h[0].tokens, (4, 5)) for h in plain[:1])  # the model alone would not


def test_constraint_progress_restarts_on_a_broken_phrase():
    phrases = ((4, 5, 6), (5,))
    p = Progress().advance(4, phrases).advance(5, phrases)
    assert (p.met, p.current, p.position) == (frozenset(), 0, 2)
    p = p.advance(4, phrases)  # breaks (4 5 6), and begins it again
    assert (p.met, p.current, p.position) == (frozenset(), 0, 1)
    p = p.advance(1, phrases).advance(5, phrases)
    assert p.met == {1} and p.met_tokens(phrases) == 1 and p.next_tokens(phrases) == [4]


def prefix_rows(rows: list[list[int]]) -> torch.Tensor:
    longest = max(map(len, rows))
    return torch.tensor([r + [-1] * (longest - len(r)) for r in rows])


def test_a_prefix_starts_every_search_and_its_log_probabilities_count():
    step, max_lens = random_step(vocab_size=7), [6, 5, 7]
    prefixes = [[5, 5, 1], [], [4]]
    lens, prefix = torch.tensor(max_lens), prefix_rows(prefixes)
    greedy = greedy_search(step, start(3), reorder_rows, hand_settings(), lens, prefix)
    beam_settings = hand_settings(beam_size=3, nbest=3, **DEFAULTS)
    beam = beam_search(step, start(3), reorder_rows, beam_settings, lens, prefix)
    noise = torch.rand(3, 2, 9, generator=torch.Generator().manual_seed(0))
    sampled = sample_search(
        step,
        start(3),
        reorder_rows,
        hand_settings(beam_size=2, sampling=Sampling(-1), length_penalty=0.0, nbest=2),
        lens,
        noise,
        prefix,
    )
    constrained = run_constrained(
        step, [((6,),), (), ((1, 1),)], max_lens, 3, prefix=prefix_rows(prefixes)
    )
    for hyps in ([[g] for g in greedy], beam, sampled, constrained):
        for p, options in zip(prefixes, hyps):
            for h in options:
                assert h.tokens[: len(p)] == p
    # The forced tokens' log-probabilities are in the score: greedy from the prefix on is greedy.
    unforced = greedy_search(step, start(3), reorder_rows, hand_settings(), lens)
    assert greedy[1] == unforced[1]
    assert greedy[0].log_prob < unforced[0].log_prob
    one = beam_search(
        step,
        start(3),
        reorder_rows,
        hand_settings(beam_size=1, length_penalty=0.0, patience=DEFAULTS["patience"]),
        lens,
        prefix,
    )
    assert [[g] for g in greedy] == one


# -- the whole path: tf translate --input-format jsonl


def jsonl(*requests: dict) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests)


REQUESTS = [
    {"text": "el perro come", "constraints": ["the house"]},
    {"text": "la casa grande", "prefix": "And the", "constraints": ["of God"]},
    {"text": "vino a la ciudad", "prefix": "He"},
    {"text": "yo soy"},
    "y dijo",
]


def translate(run, *args: str, input: str) -> list[str]:
    result = tf(
        "translate",
        run,
        "--input-format",
        "jsonl",
        "--set",
        "decode.precision=fp32",
        *args,
        input=input,
    )
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


@pytest.mark.parametrize(
    "search", [("--greedy",), ("--beam", "4"), ("--beam", "3", "--nbest", "2")]
)
def test_tf_translate_keeps_prefixes_and_constraints(trained, search):
    out = translate(trained, *search, input=jsonl(*REQUESTS))
    per_line = 2 if "--nbest" in search else 1
    assert len(out) == len(REQUESTS) * per_line
    for n, request in enumerate(REQUESTS):
        for line in out[n * per_line : (n + 1) * per_line]:
            text = line.split(" ||| ")[1] if per_line > 1 else line
            if isinstance(request, dict):
                assert text.startswith(request.get("prefix", ""))
                for phrase in request.get("constraints", []):
                    assert phrase in text, (text, phrase)
    plain = tf(
        "translate", trained, "--set", "decode.precision=fp32", *search, input="yo soy\ny dijo\n"
    )
    assert out[3 * per_line :] == plain.stdout.splitlines()  # lines that ask nothing: as plain text


def test_ctranslate2_keeps_prefixes_and_refuses_constraints(ct2_dir):  # noqa: F811
    requests = [{"text": "el perro come", "prefix": "The dog"}, {"text": "yo soy", "prefix": "I"}]
    for search in (("--greedy",), ("--beam", "3")):
        out = translate(ct2_dir, *search, input=jsonl(*requests))
        assert [line.startswith(r["prefix"]) for line, r in zip(out, requests)] == [True, True]
    result = tf(
        "translate",
        ct2_dir,
        "--input-format",
        "jsonl",
        input=jsonl({"text": "yo", "constraints": ["I"]}),
    )
    assert_user_error(
        result, "<stdin>:1: CTranslate2 has no lexical constraints; translate with the run itself"
    )


@pytest.mark.parametrize(
    "lines, fragment",
    [
        ('{"text": "hola"}\nnot json\n', "<stdin>:2: not a JSON object"),
        ('{"text": 3}\n', '<stdin>:1: "text" must be a string'),
        ('{"text": "hola", "prefix": ["a"]}\n', '<stdin>:1: "prefix" must be a string'),
        (
            '{"text": "hola", "constraints": "the"}\n',
            '<stdin>:1: "constraints" must be a list of strings',
        ),
        ('{"text": "hola", "colour": 1}\n', "<stdin>:1: unknown field(s) ['colour']"),
        (
            '{"text": "hola", "constraints": ["\\u732b"]}\n',
            "<stdin>:1: the constraint '\u732b' has pieces the tokenizer lacks",
        ),
        ('{"text": "hola", "constraints": [" "]}\n', "<stdin>:1: an empty constraint"),
        (
            '{"text": "hola", "constraints": ["the house of God and the earth"]}\n',
            "over this line's length limit of 4",
        ),
    ],
)
def test_bad_requests_are_one_line_errors(trained, lines, fragment):
    result = tf(
        "translate",
        trained,
        "--input-format",
        "jsonl",
        "--set",
        "decode.max_len_a=0",
        "--set",
        "decode.max_len_b=4",
        input=lines,
    )
    assert_user_error(result, fragment)


def test_sampling_refuses_constraints(trained):
    sets = ["--greedy", "--set", "decode.sampling_topk=5"]
    result = tf(
        "translate",
        trained,
        "--input-format",
        "jsonl",
        *sets,
        input=jsonl({"text": "yo", "constraints": ["I"]}),
    )
    assert_user_error(result, "<stdin>:1: constraints need beam search")
