from pathlib import Path

import pytest

from cli.config import Config, ConfigError, config_diff, load_config, save_config

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize(
    "name",
    [
        "tiny",
        "demo",
        "demo-fp32",
        "small",
        "base",
        "big",
        "student",
        "backtranslate",
        "finetune",
        "bidirectional",
    ],
)
def test_shipped_configs_load(name):
    config = load_config(CONFIGS / f"{name}.yaml")
    assert isinstance(config, Config)
    assert config.model.d_model % config.model.n_heads == 0


def test_small_has_the_issue_dimensions():
    m = load_config("small").model  # a bare name resolves to the shipped file
    assert (m.d_model, m.n_heads, m.d_ff, m.n_encoder_layers, m.n_decoder_layers) == (
        256,
        4,
        1024,
        3,
        3,
    )


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_dotted_key_and_nearest(tmp_path):
    path = write(tmp_path, "train:\n  max_step: 10\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert "train.max_step" in msg and "train.max_steps" in msg and str(path) in msg
    assert "\n" not in msg


def test_unknown_section(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'trian'.*'train'"):
        load_config(write(tmp_path, "trian:\n  seed: 1\n"))


@pytest.mark.parametrize(
    "text, key",
    [
        ("train:\n  max_steps: ten\n", "train.max_steps"),
        ("train:\n  lr: 'fast'\n", "train.lr"),
        ("model:\n  norm_first: 1\n", "model.norm_first"),
        ("train:\n  seed: true\n", "train.seed"),
        ("data:\n  tokenizer_type: wordpiece\n", "data.tokenizer_type"),
        ("train:\n  betas: 0.9\n", "train.betas"),
    ],
)
def test_wrong_type_names_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(write(tmp_path, text))


def test_int_accepted_for_float(tmp_path):
    assert load_config(write(tmp_path, "train:\n  lr: 1\n")).train.lr == 1.0


def test_overrides_are_parsed_as_yaml_and_checked():
    config = load_config(None, ["train.lr=3e-4", "model.norm_first=true", "data.train=x.tsv"])
    assert config.train.lr == 3e-4 and config.model.norm_first is True
    assert config.data.train == "x.tsv"
    with pytest.raises(ConfigError, match="train.lrr.*train.lr"):
        load_config(None, ["train.lrr=1"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["train.lr"])


def test_invalid_yaml_names_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"c\.yaml:3: invalid YAML"):
        load_config(write(tmp_path, "train:\n  lr: 1\n\tseed: 2\n"))


def test_missing_file():
    with pytest.raises(ConfigError, match="no such config"):
        load_config("nowhere/none.yaml")


def test_saved_config_round_trips_and_diffs(tmp_path):
    config = load_config("tiny", ["train.seed=7"])
    save_config(config, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == config
    other = load_config("tiny", ["train.seed=8"])
    assert config_diff(config.to_dict(), other.to_dict()) == ["train.seed: 7 -> 8"]
