#!/usr/bin/env bash
# `pip install .` as a user runs it: a clean virtual environment (nothing of the project's .venv)
# gets the package's runtime dependencies at requirements.txt's pins, then the package from the
# source tree (pip builds the wheel with scikit-build-core and nanobind in its own isolated
# environment, pyproject.toml's pins). Then, from another folder: `import onnxtrain` runs a
# model, the `onnxtrain` console script works, and README.md's Python quickstart runs (with
# PyTorch and ONNX Runtime installed beside, at requirements.txt's pins). Prints how long the
# install took.
# Usage: pip_install_test.sh SOURCE_DIR WORK_DIR PYTHON (a Python to make the environment with)
set -euo pipefail
source_dir=$1 work=$2 python=$3
venv=$work/venv
rm -rf "$work"
mkdir -p "$work"
"$python" -m venv "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check --quiet)
mapfile -t pins < <(grep -E '^(numpy|onnx|ml_dtypes|protobuf|typing_extensions|tqdm)==' "$source_dir/requirements.txt")
"${pip[@]}" install "${pins[@]}"
start=$(date +%s)
"${pip[@]}" install "$source_dir"
echo "pip install . took $(( $(date +%s) - start )) s"

cd "$work"  # not the source tree: `import onnxtrain` must find the installed package
"$venv/bin/python" - <<'PY'
import numpy as np
import onnx
from onnx import TensorProto, helper

import onnxtrain

assert "site-packages" in onnxtrain.__file__, onnxtrain.__file__
graph = helper.make_graph(
    [helper.make_node("Relu", ["x"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
y = onnxtrain.InferenceSession(model).run({"x": np.array([-1, 0, 2], np.float32)})["y"]
assert y.tolist() == [0, 0, 2], y
try:
    onnxtrain.InferenceSession(model).run({})
except onnxtrain.Error as e:
    assert "missing feed" in str(e), e
else:
    raise AssertionError("no onnxtrain.Error for a missing feed")
print("import onnxtrain: ok,", onnxtrain.__file__)
PY
"$venv/bin/onnxtrain" --help | grep -q make-trainable
"$venv/bin/onnxtrain" --version
status=0
"$venv/bin/onnxtrain" info missing.onnx 2>/dev/null || status=$?
[[ $status -eq 2 ]] || { echo "FAIL: onnxtrain info missing.onnx exited $status, want 2"; exit 1; }
echo "onnxtrain console script: ok"

# README.md's quickstart, in this environment (PyTorch and ONNX Runtime as a user adds them).
"${pip[@]}" install -c "$source_dir/requirements.txt" torch onnxruntime
"$venv/bin/python" "$source_dir/tests/examples/readme_quickstart.py" "$source_dir/README.md"
echo "README quickstart: ok"
