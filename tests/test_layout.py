"""The shape of `cli/`: rooms that show the architecture, imports that point one way.

    cli/main.py                    the Typer app
    cli/commands/                  one thin file per command
    cli/training/, cli/inference/, cli/exporters/, cli/importers/    libraries, by kind
    cli/config.py, device.py, figures.py   what every room uses

commands -> libraries -> shared -> data/, model/; no command imports another, no library imports
a command, and model/ and data/ never import cli.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "cli"
LIBRARIES = ("training", "inference", "exporters", "importers")
ROOMS = ("commands", *LIBRARIES)
SHARED = {"config", "device", "figures"}
LONGEST_FUNCTION = 60


def module_name(path: Path) -> str:
    """`cli/training/trainer.py` -> `cli.training.trainer`."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def cli_imports(path: Path) -> set[str]:
    """The cli modules a file imports, at any level (function-local imports included), as
    dotted names (`cli.training.run`); `from cli.training import distributed` counts as
    `cli.training.distributed`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "cli" or node.module in {f"cli.{room}" for room in ROOMS}:
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
            elif node.module.startswith("cli."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("cli.")}
    return found


def modules(folder: Path) -> dict[str, Path]:
    return {module_name(p): p for p in folder.glob("*.py") if p.stem != "__init__"}


def test_every_module_lives_in_a_room():
    top = {p.stem for p in CLI.glob("*.py")} - {"__init__"}
    assert top == SHARED | {"main"}, f"cli/ top level holds {sorted(top - SHARED - {'main'})}"
    rooms = {p.name for p in CLI.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(ROOMS)
    for room in rooms:
        doc = ast.get_docstring(ast.parse((CLI / room / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()) <= 4, f"cli/{room}/__init__.py: say what it is for"


def test_every_command_of_the_app_has_its_file_and_every_file_a_command():
    """Each @app.command in main.py calls exactly one cli.commands module, and each module in
    cli/commands/ is called by a command: the rules below then cover every command."""
    called = {}
    for node in ast.walk(ast.parse((CLI / "main.py").read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        decorators = [d.func for d in node.decorator_list if isinstance(d, ast.Call)]
        if not any(isinstance(d, ast.Attribute) and d.attr == "command" for d in decorators):
            continue
        used = {m for m in cli_imports_of(node) if m.startswith("cli.commands.")}
        assert len(used) == 1, f"main.py: {node.name} calls {sorted(used)}"
        called[node.name] = used.pop()
    assert set(called.values()) == set(modules(CLI / "commands"))
    assert len(called) >= 11


def cli_imports_of(function: ast.FunctionDef) -> set[str]:
    return {n.module for n in ast.walk(function) if isinstance(n, ast.ImportFrom) and n.module}


def test_imports_point_one_way():
    commands = set(modules(CLI / "commands"))
    for name, path in modules(CLI / "commands").items():
        wrong = cli_imports(path) & commands - {name}
        assert not wrong, f"{name} imports the command(s) {sorted(wrong)}"
        assert "cli.main" not in cli_imports(path), f"{name} imports the app"
    for room in LIBRARIES:
        for name, path in modules(CLI / room).items():
            wrong = {
                m for m in cli_imports(path) if m.startswith("cli.commands") or m == "cli.main"
            }
            assert not wrong, f"the library {name} imports {sorted(wrong)}"
    for stem in SHARED:
        wrong = {m for m in cli_imports(CLI / f"{stem}.py") if m.count(".") > 1 or m == "cli.main"}
        assert not wrong, f"cli/{stem}.py, shared by every room, imports {sorted(wrong)}"


def test_model_and_data_never_import_cli():
    for path in list((ROOT / "model").glob("*.py")) + list((ROOT / "data").rglob("*.py")):
        assert not cli_imports(path), f"{path.relative_to(ROOT)} imports cli"


def test_functions_in_cli_are_short():
    for path in CLI.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= LONGEST_FUNCTION, (
                    f"{path.relative_to(ROOT)}: {node.name} has {length} lines"
                )
