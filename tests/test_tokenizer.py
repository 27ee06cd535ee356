"""SentencePiece training and loading: round trips, special ids, layouts, digests, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from data.errors import InputError
from data.tokenizer import Tokenizer, train_tokenizer

SENTENCE = "¿Qué pasó en el año? Él comió piña y jamón."


@pytest.fixture(scope="module")
def texts(tiny_prefix):
    src = Path(f"{tiny_prefix}.es").read_text(encoding="utf-8").splitlines()
    tgt = Path(f"{tiny_prefix}.en").read_text(encoding="utf-8").splitlines()
    return src + [SENTENCE], tgt


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_round_trip_of_accented_spanish_with_a_small_vocab(tmp_path, texts, model_type):
    tok = train_tokenizer(*texts, tmp_path, vocab_size=100, seed=0, model_type=model_type)
    assert tok.src_vocab_size == tok.tgt_vocab_size == 100
    [ids] = tok.encode_src([SENTENCE])
    assert tok.unk_id not in ids
    assert all(0 <= i < tok.src_vocab_size for i in ids)
    assert tok.decode_src([ids]) == [SENTENCE]
    assert "".join(tok.src_pieces(SENTENCE)).replace("▁", " ").strip() == SENTENCE


def test_special_ids_are_read_back_from_the_model(tmp_path, texts):
    train_tokenizer(*texts, tmp_path, vocab_size=100, seed=0)
    tok = Tokenizer.load(tmp_path)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert tok.tgt_pieces([tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id]) == [
        "<pad>",
        "<unk>",
        "<s>",
        "</s>",
    ]


def test_encode_adds_no_bos_or_eos_and_decode_drops_them(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = tok.encode_tgt(["In the beginning.", "God said."])
    assert all(tok.bos_id not in row and tok.eos_id not in row for row in ids)
    padded = [[tok.bos_id, *ids[0], tok.eos_id, tok.pad_id], ids[1]]
    assert tok.decode_tgt(padded) == ["In the beginning.", "God said."]


def test_joint_model_is_one_file_shared_by_both_sides(tiny_tokenizer):
    tok = tiny_tokenizer
    assert tok.joint
    assert (tok.directory / "joint.model").is_file()
    assert not (tok.directory / "src.model").exists()
    assert tok.encode_src(["Dios"]) == tok.encode_tgt(["Dios"])


def test_separate_models_and_retraining_in_the_same_dir(tmp_path, texts):
    separate = train_tokenizer(*texts, tmp_path, vocab_size=100, seed=0, joint=False)
    assert not separate.joint
    assert sorted(p.name for p in tmp_path.glob("*.model")) == ["src.model", "tgt.model"]
    assert separate.encode_src(["Dios"]) != separate.encode_tgt(["Dios"])
    assert not Tokenizer.load(tmp_path).joint
    # Retraining joint over it removes the separate models, so load() is not ambiguous.
    assert Tokenizer.load(train_tokenizer(*texts, tmp_path, vocab_size=100, seed=0).directory).joint


def test_vocab_size_is_an_upper_bound_on_tiny_corpora(tmp_path):
    tok = train_tokenizer(
        ["uno dos tres"] * 3, ["one two three"] * 3, tmp_path, vocab_size=500, seed=0
    )
    assert tok.src_vocab_size <= 500


def test_digest_identifies_the_model_files(tmp_path, texts):
    first = train_tokenizer(*texts, tmp_path / "a", vocab_size=100, seed=0)
    assert first.digest() == Tokenizer.load(tmp_path / "a").digest()
    assert len(first.digest()) == 64
    second = train_tokenizer(*texts, tmp_path / "b", vocab_size=120, seed=0)
    assert second.digest() != first.digest()


def test_load_without_a_model_names_the_directory(tmp_path):
    with pytest.raises(InputError) as err:
        Tokenizer.load(tmp_path)
    assert str(tmp_path) in str(err.value) and "joint.model" in str(err.value)


def test_load_of_a_file_that_is_not_a_model(tmp_path):
    (tmp_path / "joint.model").write_text("not a model")
    with pytest.raises(InputError) as err:
        Tokenizer.load(tmp_path)
    assert str(tmp_path / "joint.model") in str(err.value)


def test_a_vocab_too_small_for_the_characters_says_what_to_change(tmp_path, texts):
    with pytest.raises(InputError) as err:
        train_tokenizer(*texts, tmp_path, vocab_size=20, seed=0)
    message = str(err.value)
    assert "\n" not in message and "vocab_size 20" in message and "character_coverage" in message


def test_unknown_model_type(tmp_path, texts):
    with pytest.raises(InputError, match="model_type"):
        train_tokenizer(*texts, tmp_path, vocab_size=100, seed=0, model_type="wordpiece")


def test_found_in_tells_whether_a_folder_holds_a_tokenizer(tmp_path, tiny_tokenizer):
    # `tf train` trains a tokenizer exactly when this is False: it must not miss a joint model.
    assert not Tokenizer.found_in(tmp_path)
    assert Tokenizer.found_in(tiny_tokenizer.directory)


def test_two_tokenizers_trained_alike_into_two_folders_have_one_digest(tmp_path, texts):
    """The digest is the model's content: SentencePiece records the path it was trained into
    (trainer_spec.model_prefix), which two runs' tokenizers never share (issue 67)."""
    first = train_tokenizer(*texts, tmp_path / "a", vocab_size=100, seed=0)
    second = train_tokenizer(*texts, tmp_path / "b" / "deeper", vocab_size=100, seed=0)
    model = "joint.model"
    assert (first.directory / model).read_bytes() != (second.directory / model).read_bytes()
    assert first.digest() == second.digest()
    assert first.digest() in second.digests()


def test_runs_whose_tokenizers_were_trained_alike_ensemble(trained, tiny_prefix, tmp_path):
    """Two runs of one corpus and tokenizer settings, each training its tokenizer into its own
    folder, translate as an ensemble (they were "not {run}'s" tokenizer)."""
    from test_cli import tf

    other = tmp_path / "other"
    sets = [f"data.train={tiny_prefix}", f"data.dev={tiny_prefix}-dev", "train.max_steps=1"]
    result = tf("train", "tiny", "--out", other, *[a for s in sets for a in ("--set", s)])
    assert result.exit_code == 0, result.output
    result = tf("translate", trained, other, "--greedy", input="hola\n")
    assert result.exit_code == 0, result.output


def test_a_checkpoint_recording_the_digest_of_the_files_bytes_still_loads(trained, tmp_path):
    """Runs recorded the sha256 of the model files' bytes (path included) as
    `tokenizer_digest`: their checkpoints still load with their own tokenizer, and a digest of
    neither kind is still refused."""
    import hashlib
    import shutil

    import torch

    from cli.runs.checkpoint import CheckpointError, load_checkpoint
    from cli.runs.model_dirs import resolve_checkpoint
    from cli.runs.models import load_for_inference

    run = shutil.copytree(trained, tmp_path / "older")
    tokenizer = Tokenizer.load(run / "tokenizer")
    model = run / "tokenizer" / "joint.model"
    older = hashlib.sha256(model.name.encode() + model.read_bytes()).hexdigest()
    assert older != tokenizer.digest()
    path, _ = resolve_checkpoint(run)  # the one a command loads
    ckpt = load_checkpoint(path)
    torch.save({**ckpt, "tokenizer_digest": older}, path)
    load_for_inference(run, torch.device("cpu"))
    torch.save({**ckpt, "tokenizer_digest": "0" * 64}, path)
    with pytest.raises(CheckpointError, match="another tokenizer"):
        load_for_inference(run, torch.device("cpu"))


def test_a_run_resumed_across_the_digest_change_averages_its_step_checkpoints(trained, tmp_path):
    """A run resumed after digests left out SentencePiece's training paths holds step
    checkpoints of both records (the files' bytes' sha256 before, `digest` after): `tf
    average` takes them as one tokenizer's, and records today's digest."""
    import hashlib
    import shutil

    import torch

    from cli.commands.average import run_average
    from cli.runs.checkpoint import load_checkpoint
    from cli.runs.model_dirs import resolve_checkpoint

    run = shutil.copytree(trained, tmp_path / "resumed")
    tokenizer = Tokenizer.load(run / "tokenizer")
    model = run / "tokenizer" / "joint.model"
    older = hashlib.sha256(model.name.encode() + model.read_bytes()).hexdigest()
    ckpt = load_checkpoint(resolve_checkpoint(run)[0])
    steps = run / "checkpoints"
    for old in steps.glob("step_*.pt"):
        old.unlink()
    torch.save({**ckpt, "tokenizer_digest": older}, steps / "step_1.pt")
    torch.save({**ckpt, "tokenizer_digest": tokenizer.digest()}, steps / "step_2.pt")
    run_average([str(run)], 2, tmp_path / "avg.pt")
    assert load_checkpoint(tmp_path / "avg.pt")["tokenizer_digest"] == tokenizer.digest()
