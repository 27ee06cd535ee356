"""The shape of `cli/`: commands are thin verbs over libraries, imports point one way."""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parent.parent / "cli"
COMMANDS = {
    "train",
    "translate",
    "evaluate",
    "average",
    "plot",
    "tokenizer",
    "export",
    "serve",
}  # + main, the app
LONGEST_FUNCTION = 60


def cli_imports(path: Path) -> set[str]:
    """The cli modules a file imports, at any level (function-local imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "cli":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("cli."):
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("cli.")}
    return found


def test_no_command_imports_another_and_no_library_imports_a_command():
    modules = {p.stem: p for p in CLI.glob("*.py") if p.stem not in ("__init__", "main")}
    assert COMMANDS <= set(modules)
    for name, path in modules.items():
        wrong = cli_imports(path) & COMMANDS - {name}
        assert not wrong, f"cli/{name}.py imports the command(s) {sorted(wrong)}"


def test_libraries_never_import_the_app_and_model_data_never_import_cli():
    root = CLI.parent
    for path in list((root / "model").glob("*.py")) + list((root / "data").glob("*.py")):
        assert not cli_imports(path), f"{path.relative_to(root)} imports cli"
    for path in CLI.glob("*.py"):
        assert "main" not in cli_imports(path) or path.stem == "main", path.name


def test_functions_in_cli_are_short():
    for path in CLI.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= LONGEST_FUNCTION, (
                    f"cli/{path.name}: {node.name} has {length} lines"
                )
