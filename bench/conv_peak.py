#!/usr/bin/env python3
"""oneDNN's convolutions at a model's shapes, in isolation: the yardstick of a convolution-bound
step (docs/performance.md, "The ceiling of a training step").

conv_shapes(model, batch) reads every Conv of an ONNX model with its input shape at that batch
size (ONNX shape inference over the model with its first input's batch dimension fixed);
measure(tool, shapes, threads) times them with onnxtrain-bench-conv (bench/bench_conv.cpp):
forward, backward data (not for a convolution of a graph input, whose gradient no step needs)
and backward weights, each in the memory formats oneDNN prefers, the fastest of several runs.

Usage: .venv/bin/python bench/conv_peak.py MODEL.onnx --batch 32 [--threads 1,2] [--inference]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import onnx
from onnx import shape_inference

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def _dims(value_info):
    return [d.dim_value if d.HasField("dim_value") else None for d in value_info.type.tensor_type.shape.dim]


def inferred_shapes(model_path, batch):
    """(model, {value name: dims}, names of the graph inputs that are not initializers) after ONNX
    shape inference (with data propagation; where it leaves a dimension open, ONNX Runtime's
    symbolic shape inference) over the model with every graph input's first dimension fixed to
    batch; a dimension neither determines is None."""
    model = onnx.load(model_path, load_external_data=False)
    graph = model.graph
    initializers = {t.name: list(t.dims) for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    for value in inputs:
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_value = batch
    # Shapes an exporter stored with the batch dimension symbolic would stay symbolic: infer anew.
    del graph.value_info[:]
    inferred = shape_inference.infer_shapes(model, data_prop=True).graph
    shapes = {v.name: _dims(v) for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output)}
    if any(None in dims for dims in shapes.values()):
        # ONNX's data propagation stops at a Slice whose starts are computed from Constant nodes
        # (BERT's token_type_ids at batch 1); ONNX Runtime's symbolic shape inference folds them.
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
        try:
            symbolic = SymbolicShapeInference.infer_shapes(model, auto_merge=True).graph
        except Exception:  # noqa: BLE001 - a model it cannot read keeps ONNX's shapes
            symbolic = None
        if symbolic is not None:
            for v in list(symbolic.value_info) + list(symbolic.output):
                dims = _dims(v)
                if None in shapes.get(v.name, [None]) and dims and None not in dims:
                    shapes[v.name] = dims
    shapes.update(initializers)
    return model, shapes, {i.name for i in inputs}


def conv_shapes(model_path, batch):
    """[{n, c, h, w, m, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, group, bias, input_grad}] of every
    2-D Conv, in graph order. Raises ValueError for a Conv whose shapes inference leaves open."""
    model, shapes, graph_inputs = inferred_shapes(model_path, batch)
    graph = model.graph
    result = []
    for node in graph.node:
        if node.op_type != "Conv":
            continue
        x, w = shapes.get(node.input[0]), shapes.get(node.input[1])
        if not x or not w or len(x) != 4 or None in x or None in w:
            raise ValueError(f"{model_path}: Conv '{node.name}': shapes unknown or not 2-D ({x}, {w})")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            raise ValueError(f"{model_path}: Conv '{node.name}': auto_pad is not measured here")
        pads = list(attrs.get("pads", [0, 0, 0, 0]))
        strides = list(attrs.get("strides", [1, 1]))
        dilations = list(attrs.get("dilations", [1, 1]))
        result.append({"n": x[0], "c": x[1], "h": x[2], "w": x[3], "m": w[0], "kh": w[2], "kw": w[3],
                       "sh": strides[0], "sw": strides[1], "dh": dilations[0], "dw": dilations[1],
                       "pt": pads[0], "pl": pads[1], "pb": pads[2], "pr": pads[3], "group": attrs.get("group", 1),
                       "bias": len(node.input) > 2 and node.input[2] != "",
                       "input_grad": node.input[0] not in graph_inputs})
    return result


def run_with_shapes(tool, shapes, threads, repeats, extra=()):
    """Runs a bench tool that takes --shapes FILE (a JSON list) at one thread count; its JSON output."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(shapes, f)
    try:
        cmd = [tool, "--shapes", f.name, "--threads", str(threads), "--repeats", str(repeats), *extra]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip()}")
        return json.loads(out.stdout)
    finally:
        os.remove(f.name)


def measure(tool, shapes, threads, inference=False, repeats=10):
    """onnxtrain-bench-conv's JSON ({"total_ms", "gflop", "convolutions": [...]}) at one thread count."""
    return run_with_shapes(tool, shapes, threads, repeats, ["--inference"] if inference else [])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--inference", action="store_true")
    parser.add_argument("--tool", default=os.path.join(ROOT, "build", "release", "bench", "onnxtrain-bench-conv"))
    parser.add_argument("--verbose", action="store_true", help="print every convolution")
    args = parser.parse_args()
    shapes = conv_shapes(args.model, args.batch)
    for t in (int(x) for x in args.threads.split(",")):
        r = measure(args.tool, shapes, t, args.inference)
        if args.verbose:
            for s, c in zip(shapes, r["convolutions"]):
                print(json.dumps({**s, **c}))
        print(json.dumps({"threads": t, "convolutions": len(shapes), "total_ms": round(r["total_ms"], 4),
                          "gflop": round(r["gflop"], 4),
                          "gflop_per_s": round(r["gflop"] / r["total_ms"] * 1e3, 1)}))


if __name__ == "__main__":
    sys.exit(main())
