"""Inputs that are not regular files: a named pipe (the shell's `<(command)`) or /dev/stdin is
read once, as it streams; a path that is not there, or a directory, is a one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from test_cli import ROOT, assert_user_error, tf

LINES = ["Y dijo Dios: Sea la luz.", "", "Y vió Dios que la luz era buena.", "hola"]


def feed(fifo: Path, text: str, timeout: float = 60.0) -> threading.Thread:
    """Write `text` into the named pipe `fifo` once a reader opens it (as `<(cmd)` does). A
    writer that finds no reader within `timeout` gives up, so a refusing command never hangs
    the test."""

    def write() -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:  # non-blocking: fails with ENXIO while no one reads
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer


def pipe(tmp_path: Path, name: str, lines: list[str]) -> Path:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    feed(fifo, "".join(line + "\n" for line in lines))
    return fifo


def test_translate_reads_a_named_pipe(trained, tmp_path):
    text = "".join(line + "\n" for line in LINES)
    expected = tf("translate", trained, "--greedy", input=text)
    assert expected.exit_code == 0, expected.output
    fifo = pipe(tmp_path, "in.es", LINES)
    result = tf("translate", trained, "--greedy", "-i", fifo)
    assert result.exit_code == 0, result.output
    assert result.stdout == expected.stdout


def test_eval_reads_named_pipes(trained, tiny_prefix, tmp_path):
    src = Path(f"{tiny_prefix}.es").read_text().splitlines()[:10]
    ref = Path(f"{tiny_prefix}.en").read_text().splitlines()[:10]
    (tmp_path / "src.es").write_text("".join(s + "\n" for s in src))
    (tmp_path / "ref.en").write_text("".join(r + "\n" for r in ref))
    files = tf(
        "eval", trained, "--src", tmp_path / "src.es", "--ref", tmp_path / "ref.en", "--json"
    )
    assert files.exit_code == 0, files.output
    pipes = ["--src", pipe(tmp_path, "s", src), "--ref", pipe(tmp_path, "r", ref)]
    piped = tf("eval", trained, *pipes, "--json")
    assert piped.exit_code == 0, piped.output
    assert json.loads(piped.stdout) == json.loads(files.stdout)
    hyp = tf("eval", "--hyp", pipe(tmp_path, "h", ref), "--ref", pipe(tmp_path, "r2", ref))
    assert hyp.exit_code == 0 and "BLEU = 100.00" in hyp.stdout, hyp.output


def test_translate_reads_dev_stdin(trained):
    """`-i /dev/stdin` (a pipe here), in a process of its own: CliRunner's stdin has no fd."""
    text = "".join(line + "\n" for line in LINES)
    expected = tf("translate", trained, "--greedy", input=text).stdout
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "tf"), "translate", str(trained), "--greedy"]
        + ["-i", "/dev/stdin", "--device", "cpu"],
        input=text,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == expected


def test_missing_paths_and_directories_keep_their_one_line_errors(trained, tmp_path):
    ref = tmp_path / "ref.en"
    ref.write_text("a\n")
    missing, folder = tmp_path / "missing.es", tmp_path
    assert_user_error(tf("translate", trained, "-i", missing), "missing.es: no such file")
    assert_user_error(tf("translate", trained, "-i", folder), "is a directory")
    assert_user_error(tf("eval", trained, "--src", missing, "--ref", ref), "no such file")
    assert_user_error(tf("eval", trained, "--src", folder, "--ref", ref), "is a directory")
    assert_user_error(tf("eval", "--hyp", ref, "--ref", folder), "is a directory")
