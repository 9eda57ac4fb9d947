"""Forward + backward of LayerNormalization and Attention: onnxtrain's fused backward ops
(ai.onnxtrain.LayerNormalizationGrad, AttentionGrad) against the node-by-node backward graphs
a rule of standard ONNX ops emits, and PyTorch on the same shapes, in the same run.

    .venv/bin/python bench/transformer_grad.py --bench build/release/bench/onnxtrain-bench-infer [--threads 2]

Each onnxtrain model computes the forward op and its input gradients for dY = R (a fixed
random initializer); onnxtrain-bench-infer prints the median milliseconds per run. PyTorch:
the median of the same forward + backward (autograd, dY = R). Prints one JSON line per case.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
rng = np.random.default_rng(0)


def model(nodes, inputs, outputs, inits, opset, internal=False):
    imports = [helper.make_opsetid("", opset)]
    if internal:
        imports.append(helper.make_opsetid("ai.onnxtrain", 1))
    g = helper.make_graph(nodes, "bench", inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=imports, ir_version=10)


def layer_norm_models(rows, cols):
    inputs = [helper.make_tensor_value_info("X", F, [rows, cols]), helper.make_tensor_value_info("scale", F, [cols]),
              helper.make_tensor_value_info("bias", F, [cols])]
    inits = {"R": rng.standard_normal((rows, cols)).astype(np.float32)}
    fwd = helper.make_node("LayerNormalization", ["X", "scale", "bias"], ["Y", "mean", "invstd"], axis=-1)
    fused = model([fwd, helper.make_node("LayerNormalizationGrad", ["R", "X", "scale", "mean", "invstd"], ["dX", "dS", "dB"],
                                         domain="ai.onnxtrain", axis=-1)],
                  inputs, ["Y", "dX", "dS", "dB"], inits, 17, internal=True)
    # The node-by-node rule onnxtrain had before LayerNormalizationGrad (rules_nn.cpp): the
    # statistics recomputed, dX = invstd (g - mean(g) - xhat mean(g xhat)), g = dY scale.
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["X", "scale", "bias"], ["Y"], axis=-1),
        n("ReduceMean", ["X"], ["m"], axes=[1], keepdims=1), n("Sub", ["X", "m"], ["c"]), n("Mul", ["c", "c"], ["c2"]),
        n("ReduceMean", ["c2"], ["var"], axes=[1], keepdims=1), n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]),
        n("Reciprocal", ["sd"], ["inv"]), n("Mul", ["c", "inv"], ["xhat"]),
        n("Mul", ["R", "scale"], ["g"]), n("ReduceMean", ["g"], ["mg"], axes=[1], keepdims=1), n("Sub", ["g", "mg"], ["g1"]),
        n("Mul", ["g", "xhat"], ["gx"]), n("ReduceMean", ["gx"], ["mgx"], axes=[1], keepdims=1), n("Mul", ["xhat", "mgx"], ["t"]),
        n("Sub", ["g1", "t"], ["inner"]), n("Mul", ["inv", "inner"], ["dX"]),
        n("Mul", ["R", "xhat"], ["rx"]), n("ReduceSum", ["rx", "axis0"], ["dS"], keepdims=0),
        n("ReduceSum", ["R", "axis0"], ["dB"], keepdims=0),
    ]
    inits_nodes = dict(inits, eps=np.array(1e-5, np.float32), axis0=np.array([0], np.int64))
    nodes_model = model(nodes, inputs, ["Y", "dX", "dS", "dB"], inits_nodes, 17)
    return fused, nodes_model


def attention_models(b, h, s, d):
    shape = [b, h, s, d]
    inputs = [helper.make_tensor_value_info(k, F, shape) for k in ("Q", "K", "V")]
    inits = {"R": rng.standard_normal(shape).astype(np.float32)}
    fused = model([helper.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=1),
                   helper.make_node("AttentionGrad", ["R", "Q", "K", "V"], ["dQ", "dK", "dV"], domain="ai.onnxtrain",
                                    is_causal=1, version=23)],
                  inputs, ["Y", "dQ", "dK", "dV"], inits, 23, internal=True)
    fwd_only = model([helper.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=1)], inputs, ["Y"], {}, 23)
    # Node by node: S = Q K^T scale + causal bias, P = Softmax(S), Y = P V; and the backward
    # dV = P^T dY, dP = dY V^T, dS = P (dP - rowsum(dP P)), dQ = scale dS K, dK = scale dS^T Q.
    n = helper.make_node
    bias = np.where(np.tril(np.ones((s, s), bool)), 0, -np.inf).astype(np.float32)
    fwd_nodes = [n("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]), n("MatMul", ["Q", "Kt"], ["QK"]), n("Mul", ["QK", "scale"], ["S0"]),
                 n("Add", ["S0", "bias"], ["S"]), n("Softmax", ["S"], ["P"], axis=-1), n("MatMul", ["P", "V"], ["Y"])]
    bwd_nodes = [n("Transpose", ["P"], ["Pt"], perm=[0, 1, 3, 2]), n("MatMul", ["Pt", "R"], ["dV"]),
                 n("Transpose", ["V"], ["Vt"], perm=[0, 1, 3, 2]), n("MatMul", ["R", "Vt"], ["dP"]), n("Mul", ["dP", "P"], ["dPP"]),
                 n("ReduceSum", ["dPP", "last"], ["rs"], keepdims=1), n("Sub", ["dP", "rs"], ["dPc"]), n("Mul", ["P", "dPc"], ["dS0"]),
                 n("Mul", ["dS0", "scale"], ["dS"]), n("MatMul", ["dS", "K"], ["dQ"]), n("Transpose", ["dS"], ["dSt"], perm=[0, 1, 3, 2]),
                 n("MatMul", ["dSt", "Q"], ["dK"])]
    consts = {"scale": np.array(1 / np.sqrt(d), np.float32), "bias": bias, "last": np.array([-1], np.int64)}
    nodes = model(fwd_nodes + bwd_nodes, inputs, ["Y", "dQ", "dK", "dV"], dict(inits, **consts), 17)
    nodes_fwd = model(fwd_nodes, inputs, ["Y"], {k: consts[k] for k in ("scale", "bias")}, 17)
    return fused, nodes, fwd_only, nodes_fwd


def time_onnxtrain(bench, m, threads, iters):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        onnx.save(m, path)
        out = subprocess.run([bench, path, "--iters", str(iters), "--threads", str(threads)], check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["ms"]


def time_torch(fn, iters):
    for _ in range(5):
        fn()
    ms = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ms))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bench", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=30)
    a = p.parse_args()
    import torch
    import torch.nn.functional as tf
    torch.set_num_threads(a.threads)

    rows, cols = 32 * 128, 256
    fused, nodes = layer_norm_models(rows, cols)
    x = torch.randn(rows, cols, requires_grad=True)
    w = torch.randn(cols, requires_grad=True)
    bb = torch.randn(cols, requires_grad=True)
    r = torch.randn(rows, cols)
    print(json.dumps({"case": f"LayerNormalization fwd+bwd [{rows}, {cols}] float32",
                      "fused_ms": time_onnxtrain(a.bench, fused, a.threads, a.iters),
                      "nodes_ms": time_onnxtrain(a.bench, nodes, a.threads, a.iters),
                      "torch_ms": time_torch(lambda: torch.autograd.grad(tf.layer_norm(x, (cols,), w, bb), (x, w, bb), r), a.iters)}))

    b, h, s, d = 4, 8, 128, 64
    fused, nodes, fwd, nodes_fwd = attention_models(b, h, s, d)
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    ry = torch.randn(b, h, s, d)
    sdpa = lambda: tf.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    print(json.dumps({"case": f"Attention causal fwd+bwd [{b}, {h}, {s}, {d}] float32",
                      "fused_ms": time_onnxtrain(a.bench, fused, a.threads, a.iters),
                      "nodes_ms": time_onnxtrain(a.bench, nodes, a.threads, a.iters),
                      "torch_ms": time_torch(lambda: torch.autograd.grad(sdpa(), (q, k, v), ry), a.iters)}))
    with torch.no_grad():
        print(json.dumps({"case": f"Attention causal forward [{b}, {h}, {s}, {d}] float32",
                          "fused_ms": time_onnxtrain(a.bench, fwd, a.threads, a.iters),
                          "nodes_ms": time_onnxtrain(a.bench, nodes_fwd, a.threads, a.iters),
                          "torch_ms": time_torch(sdpa, a.iters)}))


if __name__ == "__main__":
    main()
