"""Runs ONNX Runtime (CPU provider) over ONNX backend test folders, judged as onnxtrain's runner judges.

The same tests and the same rule as tests/conformance/runner.cpp (onnxtrain-conformance), so
the two results sit side by side in docs/ops.md (tests/conformance/report.py):
- every <folder>/<test>/model.onnx with each test_data_set_*: input_<i>.pb feeds the i-th graph
  input without an initializer; output_<i>.pb is compared with the i-th graph output;
- tensors: shapes and element types equal; floating-point elements within
  |got - expected| <= atol + rtol * |expected| (rtol 1e-3, atol 1e-7, ONNX's backend runner's
  defaults), NaN matching NaN; every other type exactly. bfloat16 data that older test data
  stores as uint16 bit patterns is read as the bfloat16 the model declares;
- sequences, optionals and strings as ONNX's own runner compares them
  (onnx.backend.test.runner.Runner.assert_similar_outputs): a sequence element by element, an
  empty optional only equal to an empty optional, strings exactly.
A model ONNX Runtime refuses to load or run fails with ONNX Runtime's message as the reason.

Usage:
  .venv/bin/python tests/conformance/ort_runner.py --data ROOT --folders node,light,... \
      --results FILE.json [--filter REGEX] [-v]
The results file has the shape of `onnxtrain-conformance --results`:
  {"runner": ..., "data": ROOT, "tests": [{"id": "node/test_abs", "folder": "node",
   "passed": true, "reason": "", "ops": [{"op": "ai.onnx.Abs", "version": 13}], "opset": 13,
   "implemented": null}, ...]}
("implemented" is onnxtrain's kernel coverage; null here.) The tests run in a worker process,
one at a time on one thread; a test that crashes the worker fails with the signal as reason
and the run goes on with the next test.
"""

import argparse
import ctypes
import glob
import json
import os
import re
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import onnx
import onnx.defs
from onnx import TensorProto, numpy_helper

RTOL = 1e-3
ATOL = 1e-7
DEFAULT_DATA = "/usr/share/libonnx-testdata/data"
DEFAULT_FOLDERS = "node,simple,pytorch-converted,pytorch-operator"

# Element types the onnxruntime Python binding cannot hand over as numpy arrays: passed in and
# read back as their bit patterns.
BIT_PATTERN_TYPES = {
    TensorProto.BFLOAT16: (ml_dtypes.bfloat16, np.uint16),
    TensorProto.FLOAT8E4M3FN: (ml_dtypes.float8_e4m3fn, np.uint8),
    TensorProto.FLOAT8E4M3FNUZ: (ml_dtypes.float8_e4m3fnuz, np.uint8),
    TensorProto.FLOAT8E5M2: (ml_dtypes.float8_e5m2, np.uint8),
    TensorProto.FLOAT8E5M2FNUZ: (ml_dtypes.float8_e5m2fnuz, np.uint8),
}


# ---- the test's model: ops, opset, declared types ------------------------------------------

def collect_ops(graph: onnx.GraphProto, opsets: dict, ops: set) -> None:
    """(domain.Op, op version) of every node, subgraphs included; version 0 where ONNX has no
    schema for the op at the model's opset (as ops::op_version in onnxtrain)."""
    for node in graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        version = 0
        if domain in opsets:
            try:
                version = onnx.defs.get_schema(node.op_type, opsets[domain], domain).since_version
            except onnx.defs.SchemaError:
                version = 0
        ops.add((f"{domain or 'ai.onnx'}.{node.op_type}", version))
        for attr in node.attribute:
            if attr.HasField("g"):
                collect_ops(attr.g, opsets, ops)
            for sub in attr.graphs:
                collect_ops(sub, opsets, ops)


def tensor_elem_type(value_type: onnx.TypeProto) -> int:
    return value_type.tensor_type.elem_type if value_type.HasField("tensor_type") else 0


def read_value(path: str, value_type: onnx.TypeProto):
    """One input_/output_ file as ONNX's runner reads it (Runner._load_proto), by declared type."""
    with open(path, "rb") as f:
        data = f.read()
    if value_type.HasField("sequence_type"):
        proto = onnx.SequenceProto()
        proto.ParseFromString(data)
        return numpy_helper.to_list(proto)
    if value_type.HasField("optional_type"):
        proto = onnx.OptionalProto()
        proto.ParseFromString(data)
        return numpy_helper.to_optional(proto)
    proto = TensorProto()
    proto.ParseFromString(data)
    array = numpy_helper.to_array(proto)
    if tensor_elem_type(value_type) == TensorProto.BFLOAT16 and array.dtype == np.uint16:
        array = array.view(ml_dtypes.bfloat16)  # older test data: bfloat16 as uint16 bits
    return array


def data_files(folder: str, prefix: str) -> list:
    files = glob.glob(os.path.join(folder, prefix + "*.pb"))
    return sorted(files, key=lambda p: int(re.search(r"_(\d+)\.pb$", p).group(1)))


# ---- the comparison (tests/conformance/runner.cpp compare(), and ONNX's runner for the rest) ---

def describe(value) -> str:
    if value is None:
        return "an empty optional"
    if isinstance(value, list):
        return f"a sequence of {len(value)}"
    if isinstance(value, np.ndarray):
        return f"{value.dtype.name}{list(value.shape)}"
    return type(value).__name__


def is_float(dtype: np.dtype) -> bool:
    return dtype.name.startswith(("float", "bfloat"))


def compare(got, expected) -> str:
    """Empty when equal within tolerance, else what differs."""
    if expected is None or got is None:
        return "" if expected is None and got is None else f"expected {describe(expected)}, got {describe(got)}"
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return f"expected {describe(expected)}, got {describe(got)}"
        for j, (g, e) in enumerate(zip(got, expected)):
            diff = compare(g, e)
            if diff:
                return f"sequence element {j}: {diff}"
        return ""
    if not isinstance(got, np.ndarray) or got.shape != expected.shape:
        return f"expected {describe(expected)}, got {describe(got)}"
    if expected.dtype == object:  # strings
        bad = np.flatnonzero(got.reshape(-1) != expected.reshape(-1))
        return f"element {bad[0]}: expected {expected.flat[bad[0]]!r}, got {got.flat[bad[0]]!r}" if bad.size else ""
    if got.dtype != expected.dtype:
        return f"expected {describe(expected)}, got {describe(got)}"
    if is_float(expected.dtype):
        g = got.astype(np.float64).reshape(-1)
        e = expected.astype(np.float64).reshape(-1)
        with np.errstate(invalid="ignore"):
            ok = (np.isnan(g) & np.isnan(e)) | (g == e) | (np.abs(g - e) <= ATOL + RTOL * np.abs(e))
    else:
        g = got.reshape(-1)
        e = expected.reshape(-1)
        ok = g == e
    bad = np.flatnonzero(~ok)
    return f"element {bad[0]}: expected {e[bad[0]]}, got {g[bad[0]]}" if bad.size else ""


# ---- running one test ------------------------------------------------------------------------

def to_ort_value(ort, array: np.ndarray, elem_type: int):
    if elem_type in BIT_PATTERN_TYPES:
        _, bits = BIT_PATTERN_TYPES[elem_type]
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.ascontiguousarray(array).view(bits), elem_type)
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))


def from_ort_value(value, elem_type: int) -> np.ndarray:
    if elem_type not in BIT_PATTERN_TYPES:
        return value.numpy()
    numpy_type, bits = BIT_PATTERN_TYPES[elem_type]
    shape = value.shape()
    count = int(np.prod(shape))
    raw = (ctypes.c_char * (count * np.dtype(bits).itemsize)).from_address(value.data_ptr()) if count else b""
    return np.frombuffer(bytes(raw), dtype=bits).reshape(shape).view(numpy_type)


def run_model(ort, session, model: onnx.ModelProto, feeds: dict) -> list:
    """The graph outputs in order. Models whose tensors the binding passes as numpy arrays run
    with session.run; those with bfloat16/float8 inputs or outputs go through OrtValues."""
    graph = model.graph
    declared = {x.name: x.type for x in graph.input}
    special = any(tensor_elem_type(x.type) in BIT_PATTERN_TYPES for x in list(graph.input) + list(graph.output))
    if not special:
        return session.run(None, feeds)
    values = {name: to_ort_value(ort, v, tensor_elem_type(declared[name])) for name, v in feeds.items()}
    outputs = session.run_with_ort_values(None, values)
    return [from_ort_value(o, tensor_elem_type(x.type)) for o, x in zip(outputs, graph.output)]


def run_test(ort, options, folder: str, test_id: str) -> dict:
    result = {"id": test_id, "folder": test_id.split("/")[0], "passed": False, "reason": "",
              "ops": [], "opset": 0, "implemented": None}
    try:
        model = onnx.load(os.path.join(folder, "model.onnx"))
        opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        result["opset"] = opsets.get("", 0)
        ops = set()
        collect_ops(model.graph, opsets, ops)
        result["ops"] = [{"op": op, "version": v} for op, v in sorted(ops)]
        session = ort.InferenceSession(os.path.join(folder, "model.onnx"), options,
                                       providers=["CPUExecutionProvider"])
        initializers = {t.name for t in model.graph.initializer}
        inputs = [x for x in model.graph.input if x.name not in initializers]
        data_sets = sorted(glob.glob(os.path.join(folder, "test_data_set_*")),
                           key=lambda p: int(p.rsplit("_", 1)[1]))
        if not data_sets:
            raise RuntimeError("no test_data_set_* folders")
        for data in data_sets:
            name = os.path.basename(data)
            files = data_files(data, "input_")
            if len(files) > len(inputs):
                raise RuntimeError(f"{name} has {len(files)} inputs, the model takes {len(inputs)}")
            feeds = {inputs[i].name: read_value(f, inputs[i].type) for i, f in enumerate(files)}
            outputs = run_model(ort, session, model, feeds)
            for i, f in enumerate(data_files(data, "output_")):
                if i >= len(model.graph.output):
                    raise RuntimeError("more expected outputs than graph outputs")
                declared = model.graph.output[i]
                diff = compare(outputs[i], read_value(f, declared.type))
                if diff:
                    raise RuntimeError(f"{name}, output '{declared.name}': {diff}")
        result["passed"] = True
    except Exception as e:  # noqa: BLE001 - every failure is a result, with its message
        result["reason"] = " ".join(str(e).split()) or type(e).__name__
    return result


# ---- worker and driver -----------------------------------------------------------------------

def worker(data_root: str, test_ids: list) -> None:
    """Runs the tests in order, one JSON line per test on stdout."""
    import warnings

    warnings.simplefilter("ignore")
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # the message travels in the result, not on stderr
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 4
    for test_id in test_ids:
        result = run_test(ort, options, os.path.join(data_root, test_id), test_id)
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


def list_tests(data_root: str, folders: list, pattern: re.Pattern) -> list:
    ids = []
    for folder in folders:
        path = os.path.join(data_root, folder)
        if not os.path.isdir(path):
            raise SystemExit(f"error: {path}: no such folder")
        ids += [f"{folder}/{t}" for t in sorted(os.listdir(path)) if pattern.search(f"{folder}/{t}")]
    return ids


def run_all(data_root: str, test_ids: list, verbose: bool) -> list:
    """Feeds the test ids to worker processes; a worker that dies takes the test it was running
    with it (a failure naming the signal) and a new worker goes on from the next."""
    results = []
    while len(results) < len(test_ids):
        todo = test_ids[len(results):]
        proc = subprocess.Popen([sys.executable, __file__, "--worker", "--data", data_root],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        proc.stdin.write("\n".join(todo) + "\n")
        proc.stdin.close()
        for line in proc.stdout:
            if not line.startswith('{"id"'):
                continue  # anything native code printed
            result = json.loads(line)
            results.append(result)
            if verbose or not result["passed"]:
                print(("PASS " if result["passed"] else "FAIL ") + result["id"] +
                      ("" if result["passed"] else ": " + result["reason"][:300]), flush=True)
        code = proc.wait()
        if len(results) < len(test_ids):
            test_id = test_ids[len(results)]
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            reason = f"ONNX Runtime ended the process ({how})"
            results.append({"id": test_id, "folder": test_id.split("/")[0], "passed": False,
                            "reason": reason, "ops": [], "opset": 0, "implemented": None})
            print(f"FAIL {test_id}: {reason}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=DEFAULT_DATA, help="root of the test data")
    parser.add_argument("--folders", default=DEFAULT_FOLDERS, help="comma-separated folders under the root")
    parser.add_argument("--filter", default="", help="run only tests whose id (folder/test) matches this regex")
    parser.add_argument("--results", help="write the results (JSON) here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every test, not only failures")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.data, [line.strip() for line in sys.stdin if line.strip()])
        return 0

    import onnxruntime as ort

    start = time.monotonic()
    test_ids = list_tests(args.data, args.folders.split(","), re.compile(args.filter))
    results = run_all(args.data, test_ids, args.verbose)
    passed = sum(r["passed"] for r in results)
    if args.results:
        document = {"runner": f"onnxruntime {ort.__version__} (CPUExecutionProvider)",
                    "data": os.path.abspath(args.data), "tests": results}
        with open(args.results + ".tmp", "w") as f:
            json.dump(document, f, indent=0)
        os.replace(args.results + ".tmp", args.results)
    print(f"ort conformance: {passed} passed, {len(results) - passed} failed "
          f"({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
