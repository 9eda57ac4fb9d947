"""The `onnxtrain` console script (onnxtrain._cli.main) and cli_main: the C++ CLI in-process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import mlp, package_env

import onnxtrain
from onnxtrain import _core

# What the console script `onnxtrain` that pip installs runs (pyproject.toml: project.scripts).
SCRIPT = "import sys; from onnxtrain._cli import main; sys.exit(main())"


def script(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=package_env()
    )


def test_help_and_version():
    r = script("--help")
    assert r.returncode == 0
    for command in ("info", "check", "run", "step", "make-trainable", "train", "export"):
        assert command in r.stdout
    r = script("--version")
    assert r.returncode == 0 and "onnxtrain 0.1.0" in r.stdout


def test_exit_codes_and_messages(tmp_path):
    r = script("info", tmp_path / "missing.onnx")
    assert r.returncode == 2 and "error: " in r.stderr and "no such file" in r.stderr
    r = script("make-trainable")
    assert r.returncode == 2
    r = script("no-such-command")
    assert r.returncode == 2


def test_python_dash_m(tmp_path):
    onnx.save(mlp(), tmp_path / "m.onnx")
    r = subprocess.run([sys.executable, "-m", "onnxtrain", "check", "m.onnx"], capture_output=True, text=True,
                       cwd=tmp_path, env=package_env())
    assert r.returncode == 0 and r.stdout.startswith("ok: m.onnx is valid")


def test_cli_main_in_process(tmp_path, capfd):
    onnx.save(mlp(), tmp_path / "m.onnx")
    assert _core.cli_main(["onnxtrain", "make-trainable", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "t.onnx")]) == 0
    assert "update bindings" in capfd.readouterr().out
    assert len(onnx.load(tmp_path / "t.onnx").training_info) == 1
    assert _core.cli_main(["onnxtrain", "check", str(tmp_path / "nope.onnx")]) == 2
    assert "error:" in capfd.readouterr().err


def test_train_in_process_gives_the_signal_handlers_back(tmp_path):
    # `train` installs C handlers for SIGINT and SIGTERM; after it, Ctrl-C must reach Python again.
    onnx.save(onnxtrain.make_trainable(mlp()), tmp_path / "t.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", x=rng.normal(size=(20, 4)).astype(np.float32), label=rng.integers(0, 3, 20))
    status = _core.cli_main(["onnxtrain", "train", str(tmp_path / "t.onnx"), "--data", str(tmp_path / "d.npz"),
                             "-o", str(tmp_path / "out.onnx"), "--batch-size", "5", "-q"])
    assert status == 0 and (tmp_path / "out.onnx").exists()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode boundary
            pass
