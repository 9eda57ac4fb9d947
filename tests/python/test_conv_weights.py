"""Conv reorders constant weights (an initializer no run replaces) into oneDNN's blocked layout
once, not at every run (src/ops/conv.cpp). These check that what is reused is never stale:
results against ONNX Runtime across repeated runs, and for weights that are an initializer
also listed as a graph input (IR 3: a feed replaces it for that run), which must be reordered
from whatever each run was given."""
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain


def conv_model(weights, ir_version, weights_as_input):
    """y = Conv(x, W) with W [64, 32, 3, 3] an initializer (and a graph input when asked)."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])]
    if weights_as_input:
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(weights.shape)))
    graph = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1, 1, 1, 1])], "conv", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8, 8])],
                              [numpy_helper.from_array(weights, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = ir_version
    return model


def reference(weights, x):
    session = onnxruntime.InferenceSession(conv_model(weights, 8, False).SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture
def data():
    rng = np.random.default_rng(7)
    return ([rng.standard_normal((1, 32, 8, 8)).astype(np.float32) for _ in range(3)],
            [rng.standard_normal((64, 32, 3, 3)).astype(np.float32) for _ in range(2)])


def test_constant_weights_give_the_right_result_at_every_run(data):
    xs, (w, _) = data
    session = onnxtrain.InferenceSession(conv_model(w, 8, False), threads=1)
    for x in xs + xs:
        np.testing.assert_allclose(session.run({"x": x})["y"], reference(w, x), rtol=1e-4, atol=1e-4)


def test_weights_a_feed_can_replace_are_reordered_at_every_run(data):
    xs, (w, w2) = data
    session = onnxtrain.InferenceSession(conv_model(w, 3, True), threads=1)
    x = xs[0]
    for feeds, weights in (({"x": x}, w), ({"x": x, "W": w2}, w2), ({"x": x}, w), ({"x": x, "W": w2}, w2)):
        np.testing.assert_allclose(session.run(feeds)["y"], reference(weights, x), rtol=1e-4, atol=1e-4)


def test_weights_fed_from_one_buffer_changed_in_place_are_reordered_at_every_run(data):
    # The same memory with other values at the next run: only a reorder at every run sees them
    # (a 64-byte aligned array is read where it lies, without a copy).
    xs, (w, w2) = data
    session = onnxtrain.InferenceSession(conv_model(w, 3, True), threads=1)
    buffer = np.empty(w.size + 16, np.float32)
    offset = (-buffer.ctypes.data % 64) // 4
    fed = buffer[offset:offset + w.size].reshape(w.shape)
    for weights in (w, w2, w, w2):
        fed[...] = weights
        np.testing.assert_allclose(session.run({"x": xs[0], "W": fed})["y"], reference(weights, xs[0]),
                                   rtol=1e-4, atol=1e-4)
