"""The ranges of numeric settings, declared by the schema's own fields and checked from there.

Every number of the config schema (`DataConfig` beside it, `ModelConfig` and `LoraConfig` in
`model/`, the `train` and `decode` sections in `cli/config.py`) is a field made by `ranged`:
`lr: float = ranged(1.0, "(0, inf)")`. Its interval is the field's `metadata["range"]`, and
`metadata["says"]`, where a field has it, words that range its own way in messages. The config
loader checks every number against its field when a file loads (`cli.config.check_number`);
code given settings without a file (`model.lora.check_lora`) asks `first_out_of_range`.
Neither `model/` nor `cli/` is imported here: both use it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any


@dataclasses.dataclass(frozen=True)
class Interval:
    """The range of a numeric setting, as its field declares it (`metadata["range"]`): "(0, inf)",
    "[0, 1)", "[8, inf)", "[0, 4294967295]". A field of a list of numbers declares its items'."""

    low: float
    high: float
    low_open: bool
    high_open: bool
    text: str

    @staticmethod
    @functools.cache
    def parse(text: str) -> Interval:
        m = re.fullmatch(r"([\[(])\s*(\S+?)\s*,\s*(\S+?)\s*([\])])", text)
        if not m:
            raise ValueError(f"{text!r} is no interval such as '[0, 1)'")
        low, high = (int(b) if re.fullmatch(r"-?\d+", b) else float(b) for b in m.group(2, 3))
        return Interval(low, high, m.group(1) == "(", m.group(4) == ")", text)

    def __contains__(self, x: float) -> bool:
        above = self.low < x if self.low_open else self.low <= x
        below = x < self.high if self.high_open else x <= self.high
        return above and below

    def words(self) -> str:
        """How a message says it: "positive", "0 or more", "in 0..4294967295", "in [0, 1)"."""
        if self.high == math.inf:
            if self.low == -math.inf:
                return "a finite number"
            if self.low_open:
                return "positive" if self.low == 0 else f"above {self.low}"
            return f"{self.low} or more"
        if self.text.startswith("[") and self.text.endswith("]") and isinstance(self.high, int):
            return f"in {self.low}..{self.high}"  # whole numbers (the seeds')
        return f"in {self.text}"


def ranged(default: Any, interval: str, says: str = "") -> Any:
    """A dataclass field of a number (or a list of numbers, each instance given its own copy)
    that must lie in `interval`, e.g. `ranged(0.1, "[0, 1)")`; `says`: how messages word the
    range instead ("a positive number"). A malformed interval fails where the schema is
    defined, at import."""
    Interval.parse(interval)
    metadata = {"range": interval, **({"says": says} if says else {})}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def out_of_range(value: Any, f: dataclasses.Field) -> str | None:
    """What is wrong with `value` (a number, or a list of numbers) as field `f`'s: "must be
    positive", "must be a finite number" (inf and NaN are refused first: NaN passes no
    comparison, inf every one-sided one); None where it is in range, or holds no number.

    Raises:
        TypeError: a number of a field that declares no range (a schema without one would let
            inf and -1 pass silently).
    """
    numbers = [x for x in (value if isinstance(value, list) else [value]) if is_number(x)]
    if not numbers:
        return None
    says = f.metadata.get("says")  # the field's own words for its range, where it has some
    if not all(math.isfinite(x) for x in numbers):
        return f"must be {says or 'a finite number'}"
    if "range" not in f.metadata:
        raise TypeError(f"{f.name}: its field declares no range (metadata['range'])")
    interval = Interval.parse(f.metadata["range"])
    if not all(x in interval for x in numbers):
        return f"must be {says or interval.words()}"
    return None


def first_out_of_range(node: Any, prefix: str = "") -> str | None:
    """The first number of the dataclass tree `node` (nested sections, lists of entries) out
    of its field's range, said as "lr must be positive, got 0" (its dotted name after
    `prefix`); None where every one is in range."""
    for f in dataclasses.fields(node):
        value, dotted = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            inner = [(value, f"{dotted}.")]
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            inner = [(entry, f"{dotted}[{i}].") for i, entry in enumerate(value)]
        else:
            problem = out_of_range(value, f)
            if problem:
                return f"{dotted} {problem}, got {value!r}"
            continue
        for entry, where in inner:
            if found := first_out_of_range(entry, where):
                return found
    return None
