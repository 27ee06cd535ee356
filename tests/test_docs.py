"""The README and docs/ as a reader meets them: the README fits on a page, every relative link
and anchor leads somewhere, every file of the tree they name is there, and every `tf` command
they show names a command and options that exist (`make` targets too)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer.main

from cli.main import app

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LINES = 250
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A file of the tree named in prose: `model/search/beam.py`, `cli/device.py: bound_...`.
TREE_PATH = re.compile(
    r"(?<![\w/.])((?:cli|model|data|benchmarks|tests|configs)/[\w/.-]*\.(?:py|yaml|md|sh|html))"
)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks)."""
    return {anchor(line.lstrip("#")) for line in prose_lines(page) if re.match(r"#{1,6} ", line)}


def prose_lines(page: Path) -> list[str]:
    """A page's lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in page.read_text(encoding="utf-8").split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def shell_lines(page: Path) -> list[str]:
    """The command lines of a page's ```sh blocks: a line ending in `\\` or `|`, or inside a
    quoted string, goes on on the next."""
    commands, command, fenced = [], "", False
    for line in page.read_text(encoding="utf-8").split("\n"):
        if line.lstrip().startswith("```"):
            fenced = line.strip() == "```sh"
            continue
        if not fenced:
            continue
        command += line
        if command.rstrip().endswith(("\\", "|")) or not quotes_closed(command):
            command = command.rstrip().removesuffix("\\") + " "
            continue
        commands.append(command)
        command = ""
    return commands


def quotes_closed(line: str) -> bool:
    """Whether a shell line's quotes are all closed."""
    try:
        shlex.split(line, comments=True)
    except ValueError:
        return False
    return True


def tf_commands(line: str) -> list[list[str]]:
    """The `tf ...` invocations of a shell line (after a pipe, or `torchrun ... -m cli.main`),
    each as its words up to a redirection or the next pipe."""
    words = shlex.split(line.replace("|", " | "), comments=True)
    found = []
    for i, word in enumerate(words):
        start = i + 1 if word == "tf" and (i == 0 or words[i - 1] == "|") else None
        if word == "cli.main" and i > 0 and words[i - 1] == "-m":
            start = i + 1
        if start is not None:
            ends = (j for j in range(start, len(words)) if words[j] in {"|", "<", ">", "&"})
            end = next(ends, None)
            found.append(words[start:end])
    return found


def test_the_readme_fits_on_a_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, f"README.md: {lines} lines, more than {README_LINES}"


def test_every_relative_link_and_anchor_leads_somewhere():
    broken = []
    for page in PAGES:
        for line in prose_lines(page):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # http(s), mailto: not checked here
                path, _, fragment = target.partition("#")
                linked = (page.parent / path).resolve() if path else page
                if not linked.exists():
                    broken.append(f"{page.name}: {target} (no such file)")
                elif fragment and fragment not in anchors(linked):
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_file_of_the_tree_named_is_there():
    missing = [
        f"{page.name}: {path}"
        for page in PAGES
        for line in prose_lines(page)
        for path in TREE_PATH.findall(line)
        if not (ROOT / path).exists()
    ]
    assert not missing, "\n".join(missing)


def test_every_tf_command_shown_names_options_that_exist():
    root = typer.main.get_command(app)
    wrong = []
    for page in PAGES:
        for line in shell_lines(page):
            for words in tf_commands(line):
                command = root
                while words and hasattr(command, "commands") and words[0] in command.commands:
                    command, words = command.commands[words[0]], words[1:]
                if hasattr(command, "commands"):
                    wrong.append(f"{page.name}: `{line.strip()}`: no such command")
                    continue
                options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
                for word in words:
                    if word.startswith("-") and word.split("=")[0] not in options:
                        wrong.append(f"{page.name}: `{line.strip()}`: no option {word}")
    assert not wrong, "\n".join(wrong)


def test_every_make_target_shown_exists():
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    wrong = [
        f"{page.name}: make {target}"
        for page in PAGES
        for line in shell_lines(page)
        for target in re.findall(r"^make ([a-z]+)", line.strip())
        if target not in phony
    ]
    assert not wrong, "\n".join(wrong)
