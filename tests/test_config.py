import dataclasses
import math
import types
import typing
from pathlib import Path

import pytest

from cli.config import (
    Config,
    ConfigError,
    TrainConfig,
    check_config,
    config_diff,
    load_config,
    save_config,
)
from data.config import CorpusConfig, DataConfig
from data.ranges import Interval
from model.lora import LoraConfig
from model.transformer import ModelConfig

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


def numeric_fields(cls: type = Config, prefix: str = "", entry: str = "") -> list[tuple]:
    """(dotted key, field, int or float, whether a list of them, the list of mappings it sits
    in or "") of every number of the schema, at any depth: nested sections (train.lora) and the
    entries of lists of mappings (data.train[0].weight) included."""
    found = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint, dotted = hints[f.name], f"{prefix}{f.name}"
        union = typing.get_origin(hint) is types.UnionType
        for arg in typing.get_args(hint) if union else (hint,):
            listed = typing.get_origin(arg) is list
            inner = typing.get_args(arg)[0] if listed else arg
            if dataclasses.is_dataclass(inner) and listed:
                found += numeric_fields(inner, f"{dotted}[0].", dotted)
            elif dataclasses.is_dataclass(inner):
                found += numeric_fields(inner, f"{dotted}.", entry)
            elif inner in (int, float):
                found.append((dotted, f, inner, listed, entry))
    return found


def yaml_number(x: float) -> str:
    return {math.inf: ".inf", -math.inf: "-.inf"}.get(x, ".nan" if math.isnan(x) else repr(x))


def setting(dotted: str, f, listed: bool, entry: str, value: str) -> str:
    """A --set override giving field `f` at `dotted` the YAML `value` (a list's item); in a
    list of mappings, one entry with its required keys."""
    if not entry:
        return f"{dotted}=[0.9, {value}]" if listed else f"{dotted}={value}"
    owner = {"data.train": CorpusConfig}[entry]  # the one list of mappings with numbers
    required = [g.name for g in dataclasses.fields(owner) if g.default is dataclasses.MISSING]
    keys = ", ".join([*(f"{name}: x" for name in required), f"{f.name}: {value}"])
    return f"{entry}=[{{{keys}}}]"


def out_of_range(interval: Interval, kind: type) -> list[float]:
    """A value just below and just above `interval`, where it has such ends."""
    step = 1 if kind is int else 0.5
    values = []
    if interval.low != -math.inf:
        values.append(interval.low if interval.low_open else interval.low - step)
    if interval.high != math.inf:
        values.append(interval.high if interval.high_open else interval.high + step)
    return values


def test_every_number_of_the_schema_declares_a_range_and_is_checked_at_load():
    """Issue 67, item 6: every numeric setting, nested (train.lora.alpha) or in a list
    (data.train[0].weight, train.betas), declares its range in its field; inf, -inf, NaN and a
    value past either end are refused when the config loads, in one line naming the dotted
    key (`train.lora.alpha: .inf` used to train until five non-finite losses)."""
    fields = numeric_fields()
    keys = [dotted for dotted, *_ in fields]
    assert len(keys) > 50 and {"train.lora.alpha", "data.train[0].weight"} <= set(keys)
    for dotted, f, kind, listed, entry in fields:
        assert "range" in f.metadata, f"{dotted}: no range declared"
        interval = Interval.parse(f.metadata["range"])
        assert interval.low < interval.high, dotted
        bad = out_of_range(interval, kind)
        if kind is float:
            bad += [math.inf, -math.inf, math.nan]
        for value in bad:
            override = setting(dotted, f, listed, entry, yaml_number(value))
            with pytest.raises(ConfigError) as e:
                load_config(None, [override])
            message = str(e.value)
            assert f": {dotted} must be" in message, message
            assert "\n" not in message and "got" in message, message
    load_config(None)  # every default is in its range


def test_a_config_built_in_code_is_checked_against_the_ranges_too():
    """`check_config` of a config that no file gave (an import's, a merged `train.init`
    one) walks the same ranges, lists of mappings included."""
    bad = Config(model=ModelConfig(norm_eps=math.inf))
    with pytest.raises(ConfigError, match=r"model\.norm_eps must be a finite number, got inf"):
        check_config(bad, "built")
    corpora = [CorpusConfig("x"), CorpusConfig("y", weight=-1.0)]
    bad = Config(data=DataConfig(train=corpora))
    with pytest.raises(ConfigError, match=r"data\.train\[1\]\.weight must be a positive number"):
        check_config(bad, "built")
    bad = Config(train=TrainConfig(lora=LoraConfig(rank=2, alpha=math.nan)))
    with pytest.raises(ConfigError, match=r"train\.lora\.alpha must be a finite number, got nan"):
        check_config(bad, "built")
