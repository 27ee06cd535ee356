"""`pip install .` (not editable): the wheel built from this tree, installed into a fresh
virtual environment, runs `tf` from anywhere, with every package and the files they read.

`make install`'s editable install reads the source tree, which hides a package or a data file
the wheel lacks (issue 67: `cli.importers` was left out of a hand-written list, and `tf import`
failed with the wheel alone). Here the tree is copied and built as `pip install .` builds it;
the fresh environment gets the wheel alone (`--no-deps`) and sees this environment's
third-party packages (torch, transformers ...) through a .pth file listing its site-packages,
so nothing is downloaded or installed again. A directory a .pth names is a plain path: the
editable install's finder there (which maps `cli` to this tree) never runs. Every command runs
from a directory outside the tree, so the tree cannot be imported from its working directory.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_import import small_standin

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "model", "data", "configs")  # what the wheel holds, and nothing else


def source_files(tree: Path) -> list[str]:
    """The files of `tree` that are its source: those git tracks, and the new ones it does not
    ignore (.gitignore: no venv, runs, benchmark output, caches, build products), as they lie
    in the working tree."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], tree)
    return [name for name in listed.stdout.split("\0") if name and (tree / name).is_file()]


def run(args: list, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    """`args` in `cwd`, with no PYTHONPATH: only what the environment installed is imported."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, **kwargs
    )
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result


def shipped_files(tree: Path) -> set[str]:
    """Every file of the packages in `tree` (its sources and the data they read), as paths
    relative to `tree`."""
    return {
        path.relative_to(tree).as_posix()
        for package in PACKAGES
        for path in (tree / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of this tree's source (`source_files`), as a fresh clone with the change would
    hold it, for `pip install .` to read (pip builds in the tree it is given: the copy keeps
    build/ and *.egg-info out of this one)."""
    copy = tmp_path_factory.mktemp("wheel") / "source"
    for name in source_files(ROOT):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    return copy


@pytest.fixture(scope="module")
def wheel(source) -> Path:
    """The wheel `pip install .` builds and installs."""
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    run([*pip, "--quiet", "--wheel-dir", source.parent / "dist", source], cwd=source.parent)
    (built,) = (source.parent / "dist").glob("tf-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh(wheel, tmp_path_factory) -> tuple[Path, Path]:
    """A fresh virtual environment with the wheel installed, this environment's site-packages
    visible through a .pth; returns its bin directory and its site-packages."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet"]
    run([*pip, "--no-deps", "--no-index", wheel], cwd=venv.parent)
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], venv)
    packages = Path(purelib.stdout.strip())
    # After the install: pip must not see the editable `tf` of this environment as installed.
    (packages / "third_party.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv / "bin", packages


def test_the_wheel_is_built_from_the_source_alone(source):
    """The tree the wheel is built from holds no file that git ignores (a copy of the whole
    working tree took .hypothesis/, bench-out/, tmp/ ... into it), and the source's."""
    names = [p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT,
        input="\n".join(names),
        capture_output=True,
        text=True,
    )
    assert ignored.returncode in (0, 1), ignored.stderr  # 1: none of them ignored
    assert ignored.stdout.split() == []
    assert {"pyproject.toml", "cli/main.py", "tests/test_wheel.py"} <= set(names)


def test_the_wheel_holds_every_package_and_data_file_of_the_tree(wheel, source):
    """Every file under cli/, model/, data/ and configs/ (the subpackages found, not listed;
    the recipes, the embedded corpus, the serve page), and none of tests/ or benchmarks/."""
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == set(PACKAGES)
    in_wheel = {name for name in names if name.split("/")[0] in PACKAGES}
    assert sorted(shipped_files(source) - in_wheel) == []  # (what the wheel lacks)
    assert sorted(in_wheel - shipped_files(source)) == []
    assert "cli/families/fairseq.py" in names and "configs/tiny.yaml" in names
    assert any(name.startswith("data/corpora/bible-es-en/") for name in names)
    assert any(name.startswith("cli/") and name.endswith(".html") for name in names)


def test_the_installed_tf_runs_from_its_own_site_packages(fresh, source, tmp_path):
    """`tf` and its packages come from the fresh environment's site-packages, not this tree,
    and the data files are there: a recipe by name, the embedded corpus, the serve page."""
    bin_dir, packages = fresh
    probe = """
import json
import cli, configs, data, model
from cli.config import resolve_config_path
from data.corpus import load_corpus
print(json.dumps({
    "packages": [m.__file__ for m in (cli, configs, data, model)],
    "recipe": str(resolve_config_path("tiny")),
    "corpus": len(load_corpus("bundled:bible-es-en/dev", "es", "en")),
}))
"""
    found = json.loads(run([bin_dir / "python", "-c", probe], tmp_path).stdout)
    assert all(Path(p).is_relative_to(packages) for p in found["packages"]), found
    assert Path(found["recipe"]).is_relative_to(packages)
    assert found["corpus"] > 0
    installed = {
        path.relative_to(packages).as_posix()
        for package in PACKAGES
        for path in (packages / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert sorted(shipped_files(source) - installed) == []
    assert "import" in run([bin_dir / "tf", "--help"], tmp_path).stdout


def test_the_installed_tf_imports_a_standin(fresh, tmp_path, tiny_prefix):
    """`tf import` of an OPUS-MT stand-in with the wheel alone (cli.importers, which the
    hand-written list of packages lacked)."""
    bin_dir, _ = fresh
    standin = small_standin(tmp_path, tiny_prefix)
    work = tmp_path / "elsewhere"
    work.mkdir()
    report = run([bin_dir / "tf", "import", standin, "-o", work / "run"], work)
    assert "parameters" in report.stdout and (work / "run" / "checkpoints" / "last.pt").is_file()
