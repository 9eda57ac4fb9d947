"""Models the package's tests run, built with onnx.helper (no exporter needed).

The ctest `python_package` runs this suite against the module in the CMake build tree
(PYTHONPATH=build/release/python); `pytest tests/python` in an environment with the package
installed (pip install .) runs it against that.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain

OPSET = 17


def package_env():
    """The environment for a Python subprocess that imports the package this process imported."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(onnxtrain.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def model(nodes, inputs, outputs, initializers=(), opset=OPSET, ir_version=None, check=True):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        m.ir_version = ir_version
    if check:
        onnx.checker.check_model(m)
    return m


def identity(elem_type, shape):
    """y = Identity(x) for one element type: round trips of arrays through the library."""
    return model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", elem_type, shape)],
        [helper.make_tensor_value_info("y", elem_type, shape)],
        ir_version=11,  # the IR version of the narrow types (float4e2m1: IR 11)
    )


def mlp(seed=0, inputs=4, hidden=8, classes=3):
    """logits[N, classes] = Gemm(Tanh(Gemm(x[N, inputs])))."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.5, (inputs, hidden)).astype(np.float32)
    b1 = rng.normal(0, 0.1, hidden).astype(np.float32)
    w2 = rng.normal(0, 0.5, (hidden, classes)).astype(np.float32)
    b2 = rng.normal(0, 0.1, classes).astype(np.float32)
    return model(
        [
            helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
            helper.make_node("Tanh", ["h"], ["t"]),
            helper.make_node("Gemm", ["t", "w2", "b2"], ["logits"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", inputs])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))],
    )


def mlp_reference(m, x):
    """The MLP's logits by NumPy from the model's initializers (an independent oracle)."""
    w = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    return np.tanh(x @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]


@pytest.fixture
def mlp_model():
    return mlp()


@pytest.fixture
def batch():
    rng = np.random.default_rng(1)
    return rng.normal(size=(5, 4)).astype(np.float32), np.array([0, 2, 1, 1, 0], np.int64)
