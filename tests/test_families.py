"""One record per model family (`cli.families`): each registered once, the two dispatches
(`tf import` by config.json's model_type, `tf export --to huggingface` by the model's switches)
reading the records alone, each fact stated once (a family's switches agree with its position
rule), no switch on tokenizer kinds outside the records, and what the records fixed: an export
that cannot ship its tokenizer is refused in one line, and a two-vocabulary Marian model
exported comes back as the run it was.
"""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from test_cli import assert_user_error, tf
from test_export_many import save_run, tokenizers  # noqa: F401 (a fixture)
from test_import import imported, small_standin

from cli.commands.export import export_huggingface
from cli.config import load_config
from cli.families import registry
from cli.families.family import Family
from cli.families.marian import MARIAN
from cli.families.registry import FAMILIES, exporting_family, family_of
from cli.runs.checkpoint import load_checkpoint
from cli.runs.models import build_model
from data.errors import InputError
from data.fairseq import FairseqTokenizer
from data.marian import MarianTokenizer
from model import m2m100
from model.transformer import ModelConfig, Transformer

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "cli"


def test_each_family_is_registered_once_and_its_switches_pick_it_for_export():
    types = [t for family in FAMILIES for t in family.model_types]
    assert len(types) == len(set(types)) and len(FAMILIES) == 3
    for family in FAMILIES:
        # The LAYOUT's position offset is the family's rule at the published pad id (1 in
        # NLLB-200's, M2M100's and mBART-50's files; Marian's positions start at 0).
        assert family.switches["position_offset"] == family.position_offset(1), family.title
        assert exporting_family(ModelConfig(**family.switches)) is family
    assert exporting_family(ModelConfig()) is MARIAN  # tf's own model: the paper's Post-LN


def test_a_new_family_is_one_record_in_the_registry(monkeypatch, tmp_path):
    """`tf import` dispatches by the records alone: a record added to the registry is found
    by its model_type, with nothing else to change."""
    made = replace(MARIAN, title="Made-up", model_types=("made_up",))
    monkeypatch.setattr(registry, "FAMILIES", (*FAMILIES, made))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "made_up"}))
    assert family_of(tmp_path)[0] is made
    assert isinstance(made, Family)


def cli_modules() -> dict[str, ast.Module]:
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text()) for path in CLI.rglob("*.py")}


def test_no_module_outside_the_family_records_switches_on_tokenizer_kinds():
    """Behaviour that differs per tokenizer kind is a method or attribute of `BaseTokenizer`:
    outside cli/families/, no module of cli/ names an imported tokenizer kind's class."""
    kinds = {MarianTokenizer.__name__, FairseqTokenizer.__name__}
    for name, tree in cli_modules().items():
        if name.startswith("cli/families/"):
            continue
        named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        named |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not named & kinds, f"{name} names {sorted(named & kinds)}"


def test_importers_and_exporters_never_import_the_families():
    """families -> importers, exporters: the generic machinery knows no family."""
    for name, tree in cli_modules().items():
        if not name.startswith(("cli/importers/", "cli/exporters/")):
            continue
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m and m.startswith("cli.families") for m in modules), name


def test_an_export_refuses_a_tokenizer_its_class_cannot_ship(tokenizers, tmp_path):  # noqa: F811
    """A Post-LN model with an NLLB-200 tokenizer is MarianMTModel's, whose files a Marian
    tokenizer reads or tf's own fast one: refused in one line, nothing written (it was a
    traceback after the weights had been written)."""
    tok = FairseqTokenizer(tokenizers["nllb"])
    config = load_config("tiny")
    model = Transformer(config.model, tok.src_vocab_size, tok.tgt_vocab_size, tok.pad_id)
    run = save_run(model, tokenizers["nllb"], tmp_path / "run")
    result = tf("export", run, "--to", "huggingface", "-o", tmp_path / "hf")
    assert_user_error(result, "MarianMTModel ships tf's own tokenizer or a MarianTokenizer")
    assert not (tmp_path / "hf").exists() and list(tmp_path.iterdir()) == [tmp_path / "run"]


def test_a_pre_ln_export_refuses_a_marian_tokenizer(tmp_path, tiny_prefix):
    """M2M100's class ships an NLLB-200, M2M100 or mBART-50 tokenizer's files, or tf's own:
    a Marian tokenizer there is one line (it was an IndexError)."""
    tok = MarianTokenizer(small_standin(tmp_path, tiny_prefix))
    config = load_config("tiny")
    layout = dict(m2m100.LAYOUT, position_offset=m2m100.position_offset(tok.pad_id))
    config = replace(config, model=replace(config.model, **layout))
    with pytest.raises(InputError, match="M2M100ForConditionalGeneration ships .* MarianTokenizer"):
        export_huggingface(build_model(config, tok), tok, config, tmp_path / "hf")


def test_a_two_vocabulary_marian_export_imports_back_as_the_run(tmp_path, tiny_prefix):
    """An imported OPUS-MT model of two vocabularies of other sizes (a multilingual one's
    source holds its `>>xxx<<` tokens), exported, is the same run imported again: its files
    keep their ids, so no index of the source's runs over the target's rows (an IndexError
    before)."""
    options = dict(separate=True, language_tokens=(">>fra<<", ">>deu<<"))
    run = imported(small_standin(tmp_path, tiny_prefix, **options), tmp_path)
    assert tf("export", run, "--to", "huggingface", "-o", tmp_path / "hf").exit_code == 0
    again = tmp_path / "again"
    result = tf("import", tmp_path / "hf", "-o", again)
    assert result.exit_code == 0, result.output
    before = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    after = load_checkpoint(again / "checkpoints" / "last.pt")["model"]
    assert before["src_embed.token.weight"].shape != before["tgt_embed.token.weight"].shape
    assert before.keys() == after.keys()
    for name, tensor in before.items():
        assert torch.equal(tensor, after[name]), name
