"""The languages a line is read in and written into (issue 67, items 4, 5 and 12).

Item 4: every field of a line (`tf translate --input-format jsonl`, a `tf serve` request's
items and body) is checked exactly as its command-line twin is, by one check: the same
one-line message after the place it names. Item 5: where nothing names the output language,
every command writes the model's recorded default (an NLLB-200 import's `tgt_lang`), said once
on stderr, or asks for --to in one line; never the first of its languages. Item 12: a
many-to-many import ensembles with its own fine-tunes (full and LoRA).

The NLLB-200 stand-in is `test_many_end_to_end`'s (tiny, its outputs depending on their
sources and on the language forced first). No network anywhere.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf
from test_export import ct2_dir, sharp  # noqa: F401 - fixtures
from test_languages_both_sides import both_sides  # noqa: F401 - fixture
from test_many_end_to_end import coded_corpora, nllb_run  # noqa: F401 - fixture

from cli.inference.engines import load_engine
from cli.runs.checkpoint import load_checkpoint, save_atomic
from cli.serving.app import build_app, read_page

SPA, ENG, FRA = "spa_Latn", "eng_Latn", "fra_Latn"  # FRA: the stand-in's recorded tgt_lang
LINES = "Y dijo Dios: Sea la luz.\nEn el principio.\nla casa grande\n"
# Short fp32 searches.
FAST = ["--set", "decode.max_len_a=0", "--set", "decode.max_len_b=8"]
FAST += ["--set", "decode.precision=fp32"]
SHORT = ["--greedy", *FAST]
# One sentence a batch (a budget of one source token): where two commands' outputs are
# compared exactly, each sentence is searched alone in both (`tf distill` groups a corpus
# otherwise than `tf translate` its input, and padding may tip a near-tie of fp32 logits).
ALONE = ["--set", "decode.max_tokens=1"]


def said(result) -> str:
    """A user error's message after the place it names ("--from: ", "<stdin>:1: ")."""
    assert_user_error(result)
    return result.stderr.strip().removeprefix("error: ").split(": ", 1)[1]


def served(engine, body: dict) -> tuple[int, dict]:
    pytest.importorskip("uvicorn")
    from test_serve import call, serving

    with serving(build_app(engine, "run", "pytorch")) as url:
        status, answer, _ = call(f"{url}/translate", body)
    return status, answer


# ------------------------------------------------------------------ item 4: one check per field

# field -> (a JSONL line's object, the command line's twin: its options and plain input, or
# None where the field is the lines' own).
FIELDS = {
    "to": ({"text": "hola", "to": "xx"}, (["--to", "xx"], "hola\n")),
    "from": ({"text": "hola", "from": "xx_Latn"}, (["--from", "xx_Latn"], "hola\n")),
    "text": ({"text": "ho\u0000la"}, ([], "ho\0la\n")),
    "prefix": ({"text": "hola", "prefix": "\u03a9"}, None),
    "constraints": ({"text": "hola", "constraints": ["\u03a9"]}, None),
}


@pytest.mark.parametrize("field", FIELDS)
def test_every_line_field_is_checked_as_its_command_line_twin(trained, field):
    """A one-way es->en run: a line's field refused with the words its twin is refused with,
    in `tf translate` (JSONL) and in a `tf serve` request's item (and body, for "to" and
    "from"); a line's "from" was not checked at all."""
    line, twin = FIELDS[field]
    jsonl = tf("translate", trained, "--input-format", "jsonl", input=json.dumps(line) + "\n")
    expected = said(jsonl)
    assert jsonl.stderr.startswith("error: <stdin>:1")
    if twin is not None:
        options, text = twin
        assert said(tf("translate", trained, *options, input=text)) == expected
    engine = load_engine(str(trained), torch.device("cpu"), ["decode.beam_size=2"])
    status, answer = served(engine, {"text": [line]})
    assert status == 400 and answer["error"].startswith("text[0]"), answer
    assert answer["error"].split(": ", 1)[1] == expected
    if field in ("to", "from"):  # the body's, for every sentence that names none
        status, answer = served(engine, {"text": ["hola"], field: line[field]})
        assert (status, answer["error"]) == (400, f'"{field}": {expected}')


def test_a_requests_beam_is_checked_as_the_command_lines(trained, ct2_dir):  # noqa: F811
    """A request's "beam" meets what `--beam` does: the requests' range (`tf serve --beam`),
    and the engine's own rules. A CTranslate2 directory with an imported model's greedy
    default and its beam rules (beam_stop current_length, patience 0) takes no beam CTranslate2
    cannot follow: `tf translate --beam 2` is refused at load, a request of beam 2 was searched
    with a patience of 0 (a 500)."""
    rules = ["--set", "decode.beam_stop=current_length", "--set", "decode.patience=0"]
    refused = tf("translate", ct2_dir, *rules, "--beam", "2", input="hola\n")
    assert_user_error(refused, "current_length")
    expected = refused.stderr.strip().removeprefix("error: ")
    overrides = [arg for arg in rules if arg != "--set"] + ["decode.beam_size=1"]
    engine = load_engine(str(ct2_dir), torch.device("cpu"), overrides)
    status, answer = served(engine, {"text": ["hola"], "beam": 2})
    assert (status, answer["error"]) == (400, f'"beam" 2: {expected}')
    assert served(engine, {"text": ["hola"], "beam": 1})[0] == 200
    over = tf("serve", trained, "--beam", "40", "--host", "256.0.0.0")
    assert_user_error(over, "the server's beam (--beam, decode.beam_size) must be")
    status, answer = served(engine, {"text": ["hola"], "beam": 40})
    assert status == 400 and answer["error"].startswith('"beam" must be ')
    assert answer["error"].split(" must be ")[1] == over.stderr.strip().split(" must be ")[1]


# ------------------------------------------------------------- item 5: the output language


def lines_of(result) -> list[str]:
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_a_many_to_many_import_writes_its_recorded_default_said_once(nllb_run, caplog):  # noqa: F811
    """No --to: the run's recorded tgt_lang (fra_Latn), said once on stderr, with --from or
    without; it was the first of its 202 codes (ace_Arab), without a word."""
    recorded = load_checkpoint(nllb_run / "checkpoints" / "last.pt")["config"]["data"]
    assert recorded["tgt_lang"] == FRA
    into_fra = lines_of(tf("translate", nllb_run, "--from", SPA, "--to", FRA, *SHORT, input=LINES))
    assert into_fra != lines_of(
        tf("translate", nllb_run, "--from", SPA, "--to", "ace_Arab", *SHORT, input=LINES)
    )
    with caplog.at_level(logging.INFO):
        default = lines_of(tf("translate", nllb_run, "--from", SPA, *SHORT, input=LINES))
    assert default == into_fra
    told = [r.getMessage() for r in caplog.records if "default output language" in r.getMessage()]
    assert len(told) == 1 and FRA in told[0] and "--to" in told[0]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        neither = tf("translate", nllb_run, *SHORT, input=LINES)  # the recorded source too
    assert lines_of(neither) == lines_of(
        tf("translate", nllb_run, "--from", ENG, "--to", FRA, *SHORT, input=LINES)
    )
    messages = [r.getMessage() for r in caplog.records]
    assert sum(FRA in m for m in messages) == 1 and sum(ENG in m for m in messages) == 1


def test_every_command_takes_the_output_language_from_one_place(nllb_run, tmp_path, tiny_prefix):  # noqa: F811
    """eval, backtranslate, distill, serve (its /health, a request, the page's choice) all write
    into the recorded default where nothing names another."""
    corpora = coded_corpora(tiny_prefix, tmp_path)
    src, ref = corpora / f"dev.{SPA}", corpora / f"dev.{ENG}"
    scored = tf("eval", nllb_run, "--src", src, "--ref", ref, "--from", SPA, "--json",
                "--limit", "3", *SHORT)  # fmt: skip
    assert json.loads(lines_of(scored)[0])["direction"] == f"{SPA}-{FRA}"
    out = tmp_path / "bt"
    lines_of(tf("backtranslate", nllb_run, src, "--out", out, "--from", SPA, *SHORT))
    assert (out / f"train.{FRA}").is_file() and (out / f"train.{SPA}").is_file()
    corpus = f"{{corpus: {corpora / 'dev'}, src_lang: {SPA}, tgt_lang: {FRA}}}"  # read: .spa
    out = tmp_path / "kd"
    lines_of(tf("distill", nllb_run, "--out", out, "--corpus", corpus, "--from", SPA,
                "--beam", "1", *FAST, *ALONE))  # fmt: skip
    assert (out / f"train.{FRA}").read_text().splitlines() == lines_of(
        tf("translate", nllb_run, "--from", SPA, "--to", FRA, *SHORT, *ALONE,
           input=src.read_text())
    )  # fmt: skip
    engine = load_engine(str(nllb_run), torch.device("cpu"), ["decode.max_len_b=8"], frm=SPA)
    pytest.importorskip("uvicorn")
    from test_serve import call, serving

    with serving(build_app(engine, str(nllb_run), "pytorch", page=read_page())) as url:
        status, health, _ = call(f"{url}/health")
        assert (health["src_lang"], health["tgt_lang"]) == (SPA, FRA)
        plain = call(f"{url}/translate", {"text": ["la casa"]})[1]
        named = call(f"{url}/translate", {"text": ["la casa"], "to": FRA})[1]
        assert plain == named and "translations" in plain
        # The page offers the languages of /health and chooses its defaults among them
        # (`test_the_page_chooses_the_servers_default_or_asks`).
        assert FRA in health["languages"] and SPA in health["sources"]


def page_script(page: str) -> str:
    """The script of the page at /."""
    return page.split("<script>")[1].split("</script>")[0]


# What the page's script does with /health (`cli/serving/page.html`), statement by statement:
# each language list offered starts at the server's default for it (/health's tgt_lang and
# src_lang), or at "choose…", an empty value, where the server names none or one it lacks; an
# empty choice sends no field, so that the server asks. (A real browser's test of the page
# comes with its own issue; these few statements need no JavaScript runtime to read.)
PAGE_CHOOSES = (
    'offer("to", h.languages, h.tgt_lang);',
    'offer("from", h.sources, h.src_lang);',
    "const known = langs.includes(chosen);",
    r'if (!known) $(field).add(new Option("choose\u2026", ""));',
    "new Option(lang, lang, false, lang === chosen)",
    '$(field).value = known ? chosen : "";',
    "!$(field).value ? {} : { [field]: $(field).value }",
    '...asked("to"),',
    '...asked("from"),',
)


def test_the_page_chooses_the_servers_default_or_asks():
    """The page's language lists start at the server's default (its --to, the model's
    recorded default: /health's tgt_lang and src_lang), not at the first of its languages;
    with no default it sends none, so that the server asks for one."""
    script = page_script(read_page())
    missing = [statement for statement in PAGE_CHOOSES if statement not in script]
    assert missing == []
    assert "[0]" not in script  # no list's first entry anywhere


def test_a_multilingual_run_trained_here_has_no_default_and_asks_for_to(both_sides):  # noqa: F811
    """es<->en trained from scratch (its sources saying their language) records no direction:
    without --to it is asked for in one line, with --from alone too; it wrote into en, the
    first of its target languages."""
    for options in ([], ["--from", "en"]):
        asked = tf("translate", both_sides, *options, "--greedy", input="hola\n")
        assert_user_error(asked, "--to", "en, es", "records no default")
    engine = load_engine(str(both_sides), torch.device("cpu"), [])
    assert engine.output_language == ""
    pytest.importorskip("uvicorn")
    from test_serve import call, serving

    with serving(build_app(engine, "run", "pytorch")) as url:
        health = call(f"{url}/health")[1]
        assert health["tgt_lang"] is None and health["languages"] == ["en", "es"]
        status, answer, _ = call(f"{url}/translate", {"text": ["hola"]})
        assert status == 400 and "--to" in answer["error"]


def test_a_source_in_the_default_output_language_asks_for_to(nllb_run):  # noqa: F811
    """--from (or a line's "from") naming the language the model would write by default is
    not translated into itself: --to is asked for; named, it is the user's choice."""
    assert_user_error(tf("translate", nllb_run, "--from", FRA, input="bonjour\n"), "--to", FRA)
    line = json.dumps({"text": "bonjour", "from": FRA}) + "\n"
    asked = tf("translate", nllb_run, "--input-format", "jsonl", input=line)
    assert_user_error(asked, "<stdin>:1", FRA, "--to")
    lines_of(tf("translate", nllb_run, "--from", FRA, "--to", FRA, *SHORT, input="bonjour\n"))


# ------------------------------------------------------- item 12: many-to-many ensembles


@pytest.fixture(scope="module")
def fine_tunes(nllb_run, tiny_prefix, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    """The stand-in fine-tuned on spa_Latn->eng_Latn for one update, in full and with LoRA."""
    root = tmp_path_factory.mktemp("nllb-tunes")
    corpora = coded_corpora(tiny_prefix, root)
    train, dev = (f"[{{corpus: {corpora / s}, src_lang: {SPA}, tgt_lang: {ENG}}}]"
                  for s in ("train", "dev"))  # fmt: skip
    runs = {}
    for name, extra in (("full", []), ("lora", ["--set", "train.lora.rank=2"])):
        result = tf(
            "train", "finetune", "--init", nllb_run, "--out", root / name,
            "--set", f"data.train={train}", "--set", f"data.dev={dev}",
            "--set", "train.max_steps=1", "--set", "train.eval_on_start=false",
            "--set", "train.eval_bleu_sentences=2", "--set", "train.max_tokens=256",
            "--set", "decode.max_len_a=0", "--set", "decode.max_len_b=4", *extra,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        runs[name] = root / name
    return runs


def test_an_nllb_import_ensembles_with_its_fine_tunes(nllb_run, fine_tunes, tmp_path):  # noqa: F811
    """Members that read and write the same 202 languages, any into any, with one tokenizer:
    the import, its full fine-tune and its LoRA fine-tune, in any order (they were refused,
    the import said to translate nothing)."""
    args = ["--from", SPA, "--to", ENG, *SHORT]
    alone = lines_of(tf("translate", nllb_run, *args, input=LINES))
    assert lines_of(tf("translate", nllb_run, nllb_run, *args, input=LINES)) == alone
    members = [nllb_run, fine_tunes["full"], fine_tunes["lora"]]
    assert len(lines_of(tf("translate", *members, *args, input=LINES))) == 3
    assert len(lines_of(tf("translate", *members[::-1], *args, input=LINES))) == 3
    # A member lacking one of the languages is refused, naming what each translates.
    fewer = tmp_path / "fewer"
    shutil.copytree(nllb_run, fewer)
    path = fewer / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(path)
    ckpt["config"]["data"]["languages"] = ckpt["config"]["data"]["languages"][:-1]
    save_atomic(ckpt, path)
    refused = tf("translate", nllb_run, fewer, *args, input=LINES)
    assert_user_error(refused, "any of 201 languages into any", "any of 202 languages into any")
