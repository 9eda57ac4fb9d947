"""bench/gemm_peak.py and bench/bench_gemm.cpp: the products a training step computes, read from an
ONNX model, and their timing tool (the yardstick docs/performance.md divides each GEMM-bound step by).

Run by ctest (bench_yardsticks) with ONNXTRAIN_BENCH_GEMM naming onnxtrain-bench-gemm.
"""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gemm_peak  # noqa: E402


def flops(products):
    return sum(2 * p["m"] * p["n"] * p["k"] * p["batch"] * p["count"] for p in products)


def save(tmp_path, nodes, inputs, initializers, outputs):
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in initializers])
    path = str(tmp_path / "model.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def keyed(products):
    return {p["what"]: (p["m"], p["n"], p["k"], p["batch"], p["trans_a"], p["trans_b"], p["count"]) for p in products}


def test_products_of_matmul_batched_matmul_and_gemm(tmp_path):
    # x [N, 4, 8] (an input: no gradient) x W1 [8, 16] -> h [N, 4, 16]; s = h h^T [N, 4, 4]
    # (both operands need gradients); y = Gemm(flatten(s) [N, 16], W2 [5, 16], transB).
    f32 = np.float32
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
             helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["h", "ht"], ["s"], name="bmm"),
             helper.make_node("Flatten", ["s"], ["f"]),
             helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], name="fc", transB=1)]
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 8])],
                [("w1", np.ones((8, 16), f32)), ("w2", np.ones((5, 16), f32)), ("b2", np.ones(5, f32))],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])])
    n = 3
    got = keyed(gemm_peak.product_shapes(path, n))
    assert got == {
        "mm forward": (4 * n, 16, 8, 1, False, False, 1),
        "mm dB = A^T dY": (8, 16, 4 * n, 1, True, False, 1),  # no dA: x is an input
        "bmm forward": (4, 4, 16, n, False, False, 1),
        "bmm dA = dY B^T": (4, 16, 4, n, False, True, 1),
        "bmm dB = A^T dY": (16, 4, 4, n, True, False, 1),
        "fc forward": (n, 5, 16, 1, False, True, 1),
        "fc dA": (n, 16, 5, 1, False, False, 1),  # dY [N, 5] W2 [5, 16]
        "fc dB": (5, 16, n, 1, True, False, 1),  # dY^T [5, N] f [N, 16], laid out as W2
    }
    assert keyed(gemm_peak.product_shapes(path, n, inference=True)) == {
        k: v for k, v in got.items() if k.endswith("forward")}


def test_lstm_products_match_its_equations(tmp_path):
    # Two stacked LSTMs, S 5, batch 2, input 3, hidden 4: the first one's X is an input.
    s, n, i, h = 5, 2, 3, 4
    rng = np.random.default_rng(0)
    inits = [(f"w{l}", rng.standard_normal((1, 4 * h, i if l == 0 else h)).astype(np.float32)) for l in (0, 1)]
    inits += [(f"r{l}", rng.standard_normal((1, 4 * h, h)).astype(np.float32)) for l in (0, 1)]
    nodes = [helper.make_node("LSTM", ["x", "w0", "r0"], ["y0"], name="l0", hidden_size=h),
             helper.make_node("Squeeze", ["y0", "axis"], ["x1"]),
             helper.make_node("LSTM", ["x1", "w1", "r1"], ["y1"], name="l1", hidden_size=h)]
    inits.append(("axis", np.array([1], np.int64)))
    path = save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", n, i])], inits,
                [helper.make_tensor_value_info("y1", TensorProto.FLOAT, None)])
    # inferred_shapes fixes the first dimension of the input: here S, so pass S as "batch".
    products = gemm_peak.product_shapes(path, s)
    got = keyed(products)
    assert got["l0 forward H R^T (per step)"][-1] == s
    assert "l0 dX = dG W" not in got and got["l1 dX = dG W"] == (s * n, h, 4 * h, 1, False, False, 1)
    rows = 2 * s * n * 4 * h  # bench/workload_models.py train_flops' equations, per layer
    assert flops(products) == (2 * rows * (i + h) + rows * h) + (2 * rows * (h + h) + rows * h + rows * h)


def test_bench_gemm_times_each_product_and_sums_by_count(tmp_path):
    tool = os.environ.get("ONNXTRAIN_BENCH_GEMM")
    if not tool:
        pytest.skip("ONNXTRAIN_BENCH_GEMM is not set (ctest sets it)")
    products = [{"what": "plain", "m": 64, "n": 48, "k": 32},
                {"what": "batched, transposed, 3 per step", "m": 16, "n": 24, "k": 40, "batch": 5, "trans_a": True,
                 "trans_b": True, "count": 3}]
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps(products))
    out = subprocess.run([tool, "--shapes", str(shapes), "--threads", "1", "--repeats", "2"], capture_output=True,
                         text=True, check=True)
    result = json.loads(out.stdout)
    assert [p["what"] for p in result["products"]] == ["plain", "batched, transposed, 3 per step"]
    for p in result["products"]:
        assert 0 < p["ms"] == min(p["sgemm_ms"], p["matmul_ms"])
    assert result["total_ms"] == pytest.approx(result["products"][0]["ms"] + 3 * result["products"][1]["ms"])
    assert result["gflop"] == pytest.approx(flops([{"batch": 1, "count": 1, **products[0]}, products[1]]) / 1e9)

    shapes.write_text(json.dumps([{"m": 4, "n": 0, "k": 2}]))
    bad = subprocess.run([tool, "--shapes", str(shapes)], capture_output=True, text=True)
    assert bad.returncode == 2 and "below 1" in bad.stderr
