#!/usr/bin/env python3
"""oneDNN's matrix products at a model's shapes, in isolation: the yardstick of a GEMM-bound step
beside the 2048^3 sgemm peak (docs/performance.md, "The ceiling of a training step"), as bench/conv_peak.py is for
convolutions.

product_shapes(model, batch) lists the matrix products one training step on a batch computes,
read from an ONNX model with its first input's batch dimension fixed (ONNX shape inference):
every MatMul, Gemm and LSTM's forward products, and the backward ones the gradients need. A
value needs a gradient when it depends on a float initializer (a trainable parameter) through
differentiable ops; a product's input gradient is listed only for an operand that needs one (not
for the images a first layer reads), its weight gradient likewise. For Y = A B (A [M, K], B [K, N],
batched or not): dA = dY B^T ([M, N] x [N, K]) and dB = A^T dY ([K, M] x [M, N]; a 2-D B read by
a batched A sums over the batch, one product of M x batch rows). An LSTM of input size I, hidden
H, S time steps, batch N per direction: forward X W^T ([S N, I] x [I, 4H]) and S recurrent products
([N, H] x [H, 4H]); backward dW and dR ([4H, S N] x [S N, I] and [S N, H]), S recurrent dH products
([N, 4H] x [4H, H]) and dX ([S N, 4H] x [4H, I]) when X needs a gradient, the products of
bench/workload_models.py train_flops.

measure(tool, products, threads) times them with onnxtrain-bench-gemm (bench/bench_gemm.cpp):
each product alone, dnnl_sgemm and oneDNN's matmul primitive, the faster of the two, the fastest
of several runs.

Usage: .venv/bin/python bench/gemm_peak.py MODEL.onnx --batch 32 [--threads 1,2] [--inference] [--verbose]
"""
import argparse
import json
import math
import os
import sys

import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conv_peak import inferred_shapes, run_with_shapes  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# Ops whose outputs carry no gradient to their inputs (shapes, sizes, comparisons, indices).
NOT_DIFFERENTIABLE = {"Shape", "Size", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And",
                      "Or", "Xor", "ArgMax", "ArgMin", "NonZero", "IsNaN", "IsInf", "ConstantOfShape", "EyeLike",
                      "RandomNormalLike", "RandomUniformLike", "Bernoulli"}


def _needs_gradient(model):
    """Names of the values that depend on a float initializer through differentiable ops."""
    graph = model.graph
    needs = {t.name for t in graph.initializer if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)}
    for node in graph.node:
        if node.op_type not in NOT_DIFFERENTIABLE and any(i in needs for i in node.input if i):
            needs.update(o for o in node.output if o)
    return needs


def _known(model_path, node, *dims):
    for d in dims:
        if not d or None in d:
            raise ValueError(f"{model_path}: {node.op_type} '{node.name}': shapes unknown ({', '.join(map(str, dims))})")


def _product(what, m, n, k, batch=1, trans_a=False, trans_b=False, count=1):
    return {"what": what, "m": m, "n": n, "k": k, "batch": batch, "trans_a": trans_a, "trans_b": trans_b,
            "count": count}


def _matmul(node, a, b, grad_a, grad_b):
    """MatMul's products: a [..., M, K] by b [..., K, N] (numpy broadcasting of the batch dims)."""
    m, k, n = a[-2] if len(a) > 1 else 1, a[-1], b[-1] if len(b) > 1 else 1
    batch_a, batch_b = math.prod(a[:-2]), math.prod(b[:-2])
    if batch_b == 1:  # a 2-D (or batch-1) B: the batch folds into the rows of one product
        rows, batch = m * batch_a, 1
    else:
        rows, batch = m, max(batch_a, batch_b)
    name = node.name or node.output[0]
    out = [_product(f"{name} forward", rows, n, k, batch)]
    if grad_a:
        out.append(_product(f"{name} dA = dY B^T", rows, k, n, batch, trans_b=True))
    if grad_b:
        out.append(_product(f"{name} dB = A^T dY", k, n, rows, batch, trans_a=True))
    return out


def _gemm(node, a, b, grad_a, grad_b):
    attrs = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    ta, tb = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    m, k = (a[1], a[0]) if ta else (a[0], a[1])
    n = b[0] if tb else b[1]
    name = node.name or node.output[0]
    out = [_product(f"{name} forward", m, n, k, trans_a=ta, trans_b=tb)]
    if grad_a:  # dA = dY op(B)^T, laid out as A is
        out.append(_product(f"{name} dA", m, k, n, trans_b=not tb) if not ta else
                   _product(f"{name} dA", k, m, n, trans_a=tb, trans_b=True))
    if grad_b:  # dB = op(A)^T dY, laid out as B is
        out.append(_product(f"{name} dB", k, n, m, trans_a=not ta) if not tb else
                   _product(f"{name} dB", n, k, m, trans_a=True, trans_b=ta))
    return out


def _lstm(node, x, w, grad_x):
    s, n, i = x
    directions, gates = w[0], w[1]
    h = gates // 4
    name = node.name or node.output[0]
    out = []
    for _ in range(directions):
        out += [_product(f"{name} forward X W^T", s * n, gates, i, trans_b=True),
                _product(f"{name} forward H R^T (per step)", n, gates, h, trans_b=True, count=s),
                _product(f"{name} dW = dG^T X", gates, i, s * n, trans_a=True),
                _product(f"{name} dR = dG^T H", gates, h, s * n, trans_a=True),
                _product(f"{name} dH = dG R (per step)", n, h, gates, count=s)]
        if grad_x:
            out.append(_product(f"{name} dX = dG W", s * n, i, gates))
    return out


def product_shapes(model_path, batch, inference=False):
    """The products of one training step (with inference, of one forward pass), as bench_gemm.cpp
    reads them. Raises ValueError for a product whose shapes inference leaves open."""
    model, shapes, _ = inferred_shapes(model_path, batch)
    needs = _needs_gradient(model)
    result = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "LSTM"):
            continue
        a, b = shapes.get(node.input[0]), shapes.get(node.input[1])
        _known(model_path, node, a, b)
        if node.op_type == "LSTM":
            result += _lstm(node, a, b, node.input[0] in needs)
        elif node.op_type == "Gemm":
            result += _gemm(node, a, b, node.input[0] in needs, node.input[1] in needs)
        else:
            result += _matmul(node, a, b, node.input[0] in needs, node.input[1] in needs)
    if inference:
        result = [p for p in result if " forward" in p["what"]]
    return result


def measure(tool, products, threads, repeats=10):
    """onnxtrain-bench-gemm's JSON ({"total_ms", "gflop", "products": [...]}) at one thread count."""
    return run_with_shapes(tool, products, threads, repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--inference", action="store_true", help="the forward products alone")
    parser.add_argument("--tool", default=os.path.join(ROOT, "build", "release", "bench", "onnxtrain-bench-gemm"))
    parser.add_argument("--verbose", action="store_true", help="print every product")
    args = parser.parse_args()
    products = product_shapes(args.model, args.batch, args.inference)
    for t in (int(x) for x in args.threads.split(",")):
        r = measure(args.tool, products, t)
        if args.verbose:
            for p, timed in zip(products, r["products"]):
                print(json.dumps({**p, **timed}))
        print(json.dumps({"threads": t, "products": len(products), "total_ms": round(r["total_ms"], 4),
                          "gflop": round(r["gflop"], 4),
                          "gflop_per_s": round(r["gflop"] / r["total_ms"] * 1e3, 1)}))


if __name__ == "__main__":
    sys.exit(main())
