"""Collects the seed corpora of the fuzz harnesses (fuzz/fuzz_*.cpp) into fuzz/corpus/HARNESS/.

Run with the project's Python (scripts/fuzz does, when fuzz/corpus is missing):
    .venv/bin/python fuzz/collect_seeds.py [OUT]        (OUT defaults to fuzz/corpus)
Sources: the ONNX backend conformance data of libonnx-testdata (/usr/share/libonnx-testdata)
and of the onnx wheel (models, TensorProto/SequenceProto/OptionalProto .pb files), the test
fixtures (tests/data), the committed regressions (fuzz/regressions), the first bytes of
Fashion-MNIST's IDX files, and small files written here with numpy, onnx.helper and
safetensors' layout: every dtype of .npy, IDX and safetensors, CSV files, a hand-made trainable
model, and (when build/release or build/debug has the CLI) `onnxtrain make-trainable` of a small
MLP with each optimizer. Seeds are
named by the SHA-1 of their bytes (as libFuzzer names corpus files); files over the harness's
-max_len (scripts/fuzz) are left out. The corpus folder is gitignored: libFuzzer adds to it.
"""
import gzip
import hashlib
import io
import json
import pathlib
import struct
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "fuzz" / "corpus"
DEBIAN_DATA = pathlib.Path("/usr/share/libonnx-testdata/data")
WHEEL_DATA = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data"
MNIST = pathlib.Path("/usr/share/datasets/fashion-mnist")
MAX_LEN = {"model": 65536, "tensor_pb": 16384}  # scripts/fuzz's -max_len; others: 4096
MAX_FILES = {"model": 1500, "tensor_pb": 600}


def add(harness, data, counts):
    limit = MAX_LEN.get(harness, 4096)
    if len(data) > limit or counts.get(harness, 0) >= MAX_FILES.get(harness, 200):
        return
    folder = OUT / harness
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / hashlib.sha1(data).hexdigest()
    if not path.exists():
        path.write_bytes(data)
        counts[harness] = counts.get(harness, 0) + 1


def add_files(harness, paths, counts):
    # In an order that mixes the folders (by a hash of the path), sequences and optionals first.
    def order(p):
        return ("sequence" not in str(p) and "optional" not in str(p), hashlib.sha1(str(p).encode()).digest())
    for p in sorted(paths, key=order):
        if p.is_file():
            add(harness, p.read_bytes(), counts)


def npy_bytes(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def idx_bytes(array, code):
    header = struct.pack(">HBB", 0, code, array.ndim) + struct.pack(f">{array.ndim}i", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def safetensors_bytes(tensors):
    header, offset, data = {}, 0, b""
    names = {np.float32: "F32", np.float64: "F64", np.float16: "F16", np.int64: "I64", np.int32: "I32",
             np.int16: "I16", np.int8: "I8", np.uint8: "U8", np.bool_: "BOOL", np.uint16: "U16"}
    for name, a in tensors.items():
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[a.dtype.type], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def trainable_model():
    """y = x W; loss = ReduceSum(y); algorithm: W_new = W - 0.1 dL/dW; W starts at zeros."""
    w = helper.make_tensor("W", TensorProto.FLOAT, [3, 2], [0.5] * 6)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "inference",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w])
    lr = helper.make_tensor("lr", TensorProto.FLOAT, [], [0.1])
    algorithm = helper.make_graph([
        helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0),
        helper.make_node("Gradient", ["x", "W"], ["dx", "dW"], domain="ai.onnx.preview.training",
                         xs=["x", "W"], y="loss"),
        helper.make_node("Mul", ["lr", "dW"], ["step"]),
        helper.make_node("Sub", ["W", "step"], ["W_new"]),
    ], "algorithm", [], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, []),
                         helper.make_tensor_value_info("W_new", TensorProto.FLOAT, [3, 2])], [lr])
    init = helper.make_graph([helper.make_node("Constant", [], ["W0"],
                                               value=helper.make_tensor("z", TensorProto.FLOAT, [3, 2], [0.0] * 6))],
                             "initialization", [], [helper.make_tensor_value_info("W0", TensorProto.FLOAT, [3, 2])])
    info = onnx.TrainingInfoProto()
    info.algorithm.CopyFrom(algorithm)
    info.initialization.CopyFrom(init)
    info.update_binding.add(key="W", value="W_new")
    info.initialization_binding.add(key="W", value="W0")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("ai.onnx.preview.training", 1)])
    model.training_info.append(info)
    return model.SerializeToString()


def mlp_model():
    """x [N, 4] -> Gemm(4x3) -> Relu -> Gemm(3x2) -> y [N, 2]: an inference model to make trainable."""
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in [("W1", (4, 3)), ("b1", (3,)), ("W2", (3, 2)), ("b2", (2,))]]
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]),
                               helper.make_node("Relu", ["h"], ["r"]),
                               helper.make_node("Gemm", ["r", "W2", "b2"], ["y"])], "mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def trainable_models_from_cli(counts):
    """`onnxtrain make-trainable` of mlp_model() with each optimizer and loss, when a build has the CLI."""
    cli = next((p for p in (ROOT / "build" / b / "src" / "onnxtrain" for b in ("release", "debug")) if p.exists()), None)
    if cli is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / "mlp.onnx"
        onnx.save(mlp_model(), source)
        for optimizer, loss in [("sgd", "cross_entropy"), ("momentum", "mse"), ("nesterov", "l1"),
                                ("adagrad", "cross_entropy"), ("adam", "mse"), ("adamw", "bce_with_logits")]:
            out = pathlib.Path(tmp) / f"{optimizer}.onnx"
            done = subprocess.run([cli, "make-trainable", source, "-o", out, "--optimizer", optimizer, "--loss", loss],
                                  capture_output=True)
            if done.returncode == 0:
                add("model", out.read_bytes(), counts)


def main():
    counts = {}
    for name in ["model", "npy", "npz", "idx", "csv", "tensor_pb", "safetensors"]:
        add_files(name, (ROOT / "fuzz" / "regressions" / name).glob("*"), counts)
    for data in (DEBIAN_DATA, WHEEL_DATA):
        add_files("model", data.rglob("*.onnx"), counts)
        add_files("tensor_pb", data.rglob("*.pb"), counts)
    add("model", trainable_model(), counts)
    trainable_models_from_cli(counts)

    add_files("npy", (ROOT / "tests" / "data").glob("*.npy"), counts)
    for dtype in ["<f4", "<f8", "<f2", "<i1", "<i2", "<i4", "<i8", "<u1", "<u2", "<u4", "<u8", "|b1"]:
        add("npy", npy_bytes(np.arange(6).astype(dtype).reshape(2, 3)), counts)
    add("npy", npy_bytes(np.zeros((0, 4), dtype="<f4")), counts)

    add_files("npz", (ROOT / "tests" / "data").glob("*.npz"), counts)
    for compression in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression) as z:
            z.writestr("a.npy", npy_bytes(np.arange(3, dtype="<i8")))
            z.writestr("test/b.npy", npy_bytes(np.ones((2, 2), dtype="<f4")))
        add("npz", buf.getvalue(), counts)

    for code, dtype in [(0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16), (0x0C, np.int32),
                        (0x0D, np.float32), (0x0E, np.float64)]:
        add("idx", idx_bytes(np.arange(12).astype(dtype).reshape(3, 2, 2), code), counts)
        add("idx", idx_bytes(np.arange(4).astype(dtype), code), counts)
    add("idx", gzip.compress(idx_bytes(np.arange(8, dtype=np.uint8).reshape(2, 2, 2), 0x08)), counts)
    for f in sorted(MNIST.glob("*.gz")):  # the headers and first samples of the real files
        with gzip.open(f) as g:
            head = g.read(16 + 2 * 28 * 28 if "images" in f.name else 8 + 2)
        head = head[:4] + struct.pack(">i", 2) + head[8:]  # two samples
        add("idx", head, counts)
        add("idx", gzip.compress(head), counts)

    for text in ["x,y,label\n1,2,0\n3.5,-4e3,1\n", "a\n1\n2\n3\n", "a,b\n1,\n", "a,b\r\n1,2\r\n",
                 "\"a\",b\n1,nan\n-inf,2\n", "x\n"]:
        add("csv", text.encode(), counts)

    add("safetensors", safetensors_bytes({"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                                          "b": np.array([1, 0], dtype=np.bool_),
                                          "s": np.array(7, dtype=np.int64)}), counts)
    for t in [np.float64, np.float16, np.int32, np.int16, np.int8, np.uint8, np.uint16]:
        add("safetensors", safetensors_bytes({"t": np.arange(4).astype(t)}), counts)
    add("safetensors", safetensors_bytes({"empty": np.zeros((0, 3), dtype=np.float32)}), counts)

    for name in sorted(counts):
        print(f"collect_seeds: {counts[name]:5d} seeds -> {OUT / name}")


if __name__ == "__main__":
    main()
