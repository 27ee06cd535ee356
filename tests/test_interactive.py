"""`tf translate` on a pipe or a terminal answers each line as soon as it is complete."""

from __future__ import annotations

import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli.inference.decoding import as_they_arrive
from data.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def lines_of(stream) -> queue.Queue:
    """The lines `stream` yields, in a queue filled by a thread (so a read can time out)."""
    out: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in stream:
            out.put(line)
        out.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return out


def test_the_first_line_is_answered_while_the_pipe_stays_open(trained: Path):
    proc = subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "translate", str(trained)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        answers = lines_of(proc.stdout)
        proc.stdin.write("hola mundo\n")
        proc.stdin.flush()
        # Before the second line is even written: the old reader waited for 4,096 lines.
        first = answers.get(timeout=60)
        assert first is not None and first.endswith("\n")
        proc.stdin.write("buenos dias\nbuenas noches\n")
        proc.stdin.close()
        rest = [answers.get(timeout=60) for _ in range(3)]
        assert rest[-1] is None and all(line is not None for line in rest[:2])
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert "> " not in proc.stderr.read()  # a prompt only on a terminal
    finally:
        proc.kill()


def test_lines_that_arrive_together_are_one_group():
    assert list(as_they_arrive(iter(["a", "b", "c"]), wait=5)) == [["a", "b", "c"]]
    assert list(as_they_arrive(iter(["a", "b", "c"]), size=2, wait=5)) == [["a", "b"], ["c"]]


def test_a_pause_ends_a_group():
    gate = threading.Event()

    def slow():
        yield "first"
        gate.wait(timeout=30)  # the second line comes only once the first group was answered
        yield "second"

    groups = as_they_arrive(slow(), wait=0.01)
    assert next(groups) == ["first"]
    gate.set()
    assert list(groups) == [["second"]]


def test_a_read_error_reaches_the_consumer():
    def broken():
        yield "fine"
        raise InputError("<stdin>:2: not valid UTF-8 (byte 0xff)")

    with pytest.raises(InputError, match="<stdin>:2"):
        list(as_they_arrive(broken(), wait=5))


def test_a_terminal_gets_a_prompt_and_an_answer_per_line(trained: Path):
    import os
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "translate", str(trained)],
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
        cwd=ROOT,
    )
    os.close(slave)
    try:
        answers = lines_of(proc.stdout)
        seen, deadline = b"", time.monotonic() + 60
        while b"es> " not in seen:  # the prompt, before any input
            assert time.monotonic() < deadline, seen
            if select.select([master], [], [], 1)[0]:
                seen += os.read(master, 1024)
        os.write(master, b"hola mundo\n")
        assert answers.get(timeout=60) is not None
        os.write(master, b"\x04")  # Ctrl-D ends the session
        assert answers.get(timeout=60) is None
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        os.close(master)
