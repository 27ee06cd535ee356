"""The shape of `cli/`: rooms that show the architecture, imports that point one way.

    cli/main.py                     the Typer app
    cli/commands/                   one thin file per command
    cli/families/                   one record per model family
    cli/serving/                    `tf serve`: the app, its batcher, its workers
    cli/training/                   the trainer and what it trains with
    cli/importers/, cli/exporters/  models in from, and out to, other formats
    cli/inference/                  text in, text out
    cli/runs/                       the run store: run directories, checkpoints, models loaded
    cli/config.py, device.py, figures.py   what every room uses

commands -> libraries -> shared -> data/, model/: no command imports another, no library
imports a command, model/ and data/ never import cli, and the run store, below every other
library, imports only what every room uses. No import circle anywhere: neither of modules (an
import inside a function counts: it would only hide the circle) nor of rooms.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "cli"
# Every room a library may be; those in REQUIRED exist, the others once made.
LIBRARIES = ("runs", "training", "inference", "serving", "importers", "exporters", "families")
REQUIRED = {"commands", "runs", "training", "inference", "importers", "exporters"}
SHARED = {"config", "device", "figures"}
STORE = "runs"  # the run store: it imports only SHARED (and data/, model/)
LONGEST_FUNCTION = 60


def module_name(path: Path) -> str:
    """`cli/training/trainer.py` -> `cli.training.trainer`; `cli/runs/__init__.py` -> `cli.runs`."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ALL = {module_name(p): p for p in CLI.rglob("*.py")}


def rooms() -> list[str]:
    """The folders of cli/ that hold modules."""
    return sorted(p.name for p in CLI.iterdir() if (p / "__init__.py").is_file())


def cli_imports(path: Path) -> set[str]:
    return imports_in(path.read_text())


def imports_in(source: str) -> set[str]:
    """The cli modules `source` imports, at any level (function-local imports included), as
    dotted names (`cli.training.run`); `from cli.training import distributed` counts as
    `cli.training.distributed`, `from cli.training.run import RunDir` as `cli.training.run`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "cli" or node.module.startswith("cli."):
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    found.add(name if name in ALL else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("cli.")}
    return found


def modules(folder: Path) -> dict[str, Path]:
    return {module_name(p): p for p in folder.glob("*.py") if p.stem != "__init__"}


def room_of(module: str) -> str:
    """`cli.training.trainer` -> training; `cli.config` -> shared; `cli.main` -> main."""
    parts = module.split(".")
    if len(parts) > 2 or module in {f"cli.{r}" for r in rooms()}:
        return parts[1]
    return "main" if module == "cli.main" else "shared"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of `graph` (node -> the nodes it points to): each strongly connected
    component of more than one node, or a node pointing to itself (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def module_graph() -> dict[str, set[str]]:
    """Each cli module -> the cli modules it imports (a package's `__init__` counted as the
    package, which its modules do not import)."""
    return {name: cli_imports(path) & set(ALL) - {name} for name, path in ALL.items()}


def room_graph() -> dict[str, set[str]]:
    """Each room of cli/ (and main, and the shared modules) -> the rooms it imports from."""
    graph: dict[str, set[str]] = {}
    for name, imported in module_graph().items():
        graph.setdefault(room_of(name), set()).update(room_of(m) for m in imported)
    return {room: targets - {room} for room, targets in graph.items()}


def shown(circles: Iterable[list[str]]) -> str:
    return "; ".join(" <-> ".join(circle) for circle in circles)


def test_every_module_lives_in_a_room():
    top = {p.stem for p in CLI.glob("*.py")} - {"__init__"}
    assert top == SHARED | {"main"}, f"cli/ top level holds {sorted(top - SHARED - {'main'})}"
    found = set(rooms())
    assert REQUIRED <= found <= {"commands", *LIBRARIES}, f"cli/ holds the rooms {sorted(found)}"
    folders = {p.name for p in CLI.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == found, f"cli/{sorted(folders - found)[0]}: a folder that is no room"
    for room in found:
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
    for room in set(rooms()) & set(LIBRARIES):
        for name, path in modules(CLI / room).items():
            wrong = {
                m for m in cli_imports(path) if m.startswith("cli.commands") or m == "cli.main"
            }
            assert not wrong, f"the library {name} imports {sorted(wrong)}"
    for stem in SHARED:
        wrong = {m for m in cli_imports(CLI / f"{stem}.py") if room_of(m) != "shared"}
        assert not wrong, f"cli/{stem}.py, shared by every room, imports {sorted(wrong)}"


def test_the_run_store_imports_only_what_every_room_uses():
    """cli/runs/ lies below training, inference, importers and exporters, which all read
    runs: it imports the shared modules (and data/, model/), nothing of another room."""
    assert STORE in rooms()
    store = {name: path for name, path in ALL.items() if room_of(name) == STORE}
    for name, path in store.items():
        wrong = {m for m in cli_imports(path) if room_of(m) not in {STORE, "shared"}}
        assert not wrong, f"{name}, in the run store, imports {sorted(wrong)}"


def test_no_import_circle_among_cli_modules():
    """Not even one held apart by an import inside a function."""
    found = cycles(module_graph())
    assert not found, f"import circles: {shown(found)}"


def test_no_circle_among_cli_rooms():
    """The rooms (and main, and the shared modules) import each other one way only."""
    found = cycles(room_graph())
    assert not found, f"rooms importing each other in a circle: {shown(found)}"


def test_circles_are_found_however_they_are_made():
    """The finder itself: a circle of two, of three behind a way out, a module importing
    itself; none in a tree; and an import inside a function counts."""
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    hidden = "def load():\n    from cli.training.lora import adapt\n\n    return adapt\n"
    assert imports_in(hidden) == {"cli.training.lora"}
    assert imports_in("from cli.training import lora, run\n") == {
        "cli.training.lora",
        "cli.training.run",
    }


def test_a_checkpoint_dict_is_made_in_one_place():
    """Only the run store's checkpoint module writes a dict with the format tag: the trainer,
    `tf import`, `tf prune`, `tf average` and a LoRA run's base.pt all make theirs through
    `checkpoint_dict` (or `weights_only`), so the format is said once."""
    store = CLI / STORE / "checkpoint.py"
    for path in CLI.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            keys = [k.value for k in getattr(node, "keys", []) if isinstance(k, ast.Constant)]
            if isinstance(node, ast.Dict) and "format" in keys and path != store:
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno}: a checkpoint dict")


def test_model_and_data_never_import_cli():
    for path in list((ROOT / "model").rglob("*.py")) + list((ROOT / "data").rglob("*.py")):
        assert not cli_imports(path), f"{path.relative_to(ROOT)} imports cli"


def test_functions_in_cli_are_short():
    for path in CLI.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= LONGEST_FUNCTION, (
                    f"{path.relative_to(ROOT)}: {node.name} has {length} lines"
                )
