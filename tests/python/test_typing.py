"""The type stubs: _core.pyi names what the extension module defines, and mypy --strict passes
on the package and on a usage file whose wrong lines must be errors (typing_usage.py)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

import onnxtrain
from onnxtrain import _core

PACKAGE = os.path.dirname(os.path.abspath(onnxtrain.__file__))
STUB = os.path.join(PACKAGE, "_core.pyi")
ALIASES = {"Model", "ArrayIn"}  # type aliases of the stub only


def stub_names():
    tree = ast.parse(open(STUB, encoding="utf-8").read())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            members[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return top, members


def test_stub_names_what_the_module_defines():
    top, members = stub_names()
    assert top - ALIASES == {n for n in dir(_core) if not n.startswith("__")}
    for cls, names in members.items():
        defined = {n for n in vars(getattr(_core, cls)) if not n.startswith("__")} | {"__init__"}
        if cls == "Error":
            continue
        assert names | {"__init__"} == defined, cls


def test_package_exports():
    assert set(onnxtrain.__all__) <= set(dir(onnxtrain))
    assert os.path.exists(os.path.join(PACKAGE, "py.typed"))


def test_mypy_strict(tmp_path):
    pytest.importorskip("mypy")  # requirements.txt has it; an environment with only the package may not
    usage = os.path.join(os.path.dirname(__file__), "typing_usage.py")
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), PACKAGE, usage],
        capture_output=True, text=True, cwd=os.path.dirname(PACKAGE),
    )
    assert r.returncode == 0, r.stdout + r.stderr
