"""Hostile models get a clear error and bounded memory, never a crash or a hang (issue 19).

Each case writes a model that declares far more than the machine has — tensors of 10^12
elements, subgraphs nested 10^4 deep, a 3 GB file — or is merely big (10^6 nodes), runs the
`onnxtrain` command on it with a time limit, and checks the exit status, the message and the
child's peak resident memory (os.wait4's ru_maxrss).

Usage: resource_limits.py --onnxtrain build/release/src/onnxtrain
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MIB = 1 << 20


def run_measured(cmd: list[str], timeout: float, limit_address_space: int | None = None):
    """Runs cmd; returns (exit status, output, the child's peak RSS in bytes from wait4, seconds).
    Fails when it runs past `timeout` (a hang); `limit_address_space` sets its RLIMIT_AS."""
    def limits():
        if limit_address_space:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (limit_address_space, limit_address_space))

    out = tempfile.TemporaryFile(mode="w+")
    start = time.monotonic()
    child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, preexec_fn=limits,
                             start_new_session=True)
    deadline = start + timeout
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            os.killpg(child.pid, signal.SIGKILL)
            os.wait4(child.pid, 0)
            raise AssertionError(f"{' '.join(cmd)}: no result after {timeout} s (a hang)")
        time.sleep(0.02)
    child.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    return child.returncode, out.read(), usage.ru_maxrss * 1024, time.monotonic() - start


def expect_error(cmd, needles, max_rss, timeout=60.0, limit_address_space=None):
    code, output, rss, seconds = run_measured(cmd, timeout, limit_address_space)
    what = " ".join(Path(c).name if "/" in c else c for c in cmd)
    assert code == 2, f"{what}: exit {code} (expected 2, an error)\n{output}"
    for needle in needles:
        assert needle in output, f"{what}: message lacks {needle!r}:\n{output}"
    assert rss <= max_rss, f"{what}: peak RSS {rss / MIB:.0f} MiB > {max_rss / MIB:.0f} MiB"
    print(f"ok   {what}: exit 2 in {seconds:.2f} s, peak RSS {rss / MIB:.0f} MiB: {output.strip().splitlines()[-1]}")


def model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# --- protobuf bytes by hand, for models too deep or too big for onnx's Python helpers ---------

def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def message_field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def int_field(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def text_field(number: int, text: str) -> bytes:
    return message_field(number, text.encode())


def value_info(name: str, elem_type: int | None = None, dims=()) -> bytes:
    # ValueInfoProto: name 1, type 2; TypeProto.tensor_type 1: elem_type 1, shape 2 (dim 1: dim_value 1)
    if elem_type is None:
        return text_field(1, name)
    shape = b"".join(message_field(1, int_field(1, d)) for d in dims)
    tensor_type = int_field(1, elem_type) + message_field(2, shape)
    return text_field(1, name) + message_field(2, message_field(1, tensor_type))


def node(inputs, outputs, op_type, attributes=b"") -> bytes:
    # NodeProto: input 1, output 2, op_type 4, attribute 5
    return b"".join(text_field(1, i) for i in inputs) + b"".join(text_field(2, o) for o in outputs) + \
        text_field(4, op_type) + attributes


def graph_attribute(name: str, graph: bytes) -> bytes:
    # AttributeProto: name 1, g 6, type 20 (GRAPH = 5)
    return message_field(5, text_field(1, name) + message_field(6, graph) + int_field(20, 5))


def model_bytes(graph: bytes) -> bytes:
    # ModelProto: ir_version 1, graph 7, opset_import 8 (domain 1, version 2)
    return int_field(1, 8) + message_field(7, graph) + message_field(8, text_field(1, "") + int_field(2, 17))


def nested_if_model(depth: int) -> bytes:
    """`depth` If nodes, each the then_branch of the one above; the innermost returns x."""
    leaf = message_field(1, node(["x"], ["y0"], "Identity")) + text_field(2, "leaf") + message_field(12, value_info("y0"))
    inner = leaf
    for i in range(depth):
        attributes = graph_attribute("then_branch", inner) + graph_attribute("else_branch", leaf)
        inner = message_field(1, node(["c"], [f"y{i + 1}"], "If", attributes)) + text_field(2, f"g{i}") + \
            message_field(12, value_info(f"y{i + 1}"))
    inputs = message_field(11, value_info("c", TensorProto.BOOL, [])) + message_field(11, value_info("x", TensorProto.FLOAT, [1]))
    return model_bytes(inner + inputs)


def chain_model(nodes: int) -> bytes:
    """x[4] -> `nodes` Relu nodes in a chain -> y."""
    body = b"".join(message_field(1, node([f"t{i}"], [f"t{i + 1}"], "Relu")) for i in range(nodes))
    graph = body + text_field(2, "chain") + message_field(11, value_info("t0", TensorProto.FLOAT, [4])) + \
        message_field(12, value_info(f"t{nodes}", TensorProto.FLOAT, [4]))
    return model_bytes(graph)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnxtrain", required=True)
    parser.add_argument("--nodes", type=int, default=1_000_000, help="nodes of the big chain model")
    args = parser.parse_args()
    exe = args.onnxtrain
    with tempfile.TemporaryDirectory() as folder:
        d = Path(folder)
        np.save(d / "x.npy", np.array([1.5], np.float32))
        np.save(d / "c.npy", np.array(True))
        np.save(d / "t0.npy", np.array([-1.0, 0.0, 2.0, -3.0], np.float32))

        # 10^12 elements declared by an initializer that holds no data.
        big = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10**6, 10**6])
        onnx.save(model([helper.make_node("Add", ["x", "w"], ["y"])],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10**6, 10**6])], [big]),
                  d / "huge_initializer.onnx")
        for command in ("run", "check"):
            cmd = [exe, command, str(d / "huge_initializer.onnx")] + (["-i", f"x={d / 'x.npy'}"] if command == "run" else [])
            # run: onnxtrain's own check of the data's size; check: the ONNX checker's.
            names_it = "'w'" if command == "run" else "tensor name: w"
            expect_error(cmd, ["huge_initializer.onnx", names_it], 200 * MIB)

        # 10^12 elements made at run time (ConstantOfShape of a constant shape: folded when planned).
        def shape_model(dims, name):
            onnx.save(model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")], [],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                            [numpy_helper.from_array(np.array(dims, np.int64), "s")]), d / name)
        shape_model([10**6, 10**6], "huge_fill.onnx")
        expect_error([exe, "run", str(d / "huge_fill.onnx")], ["huge_fill.onnx", "'fill'", "out of memory"], 200 * MIB)
        # ... whose element count overflows 64 bits.
        shape_model([1 << 40, 1 << 40, 1 << 40], "overflow_fill.onnx")
        expect_error([exe, "run", str(d / "overflow_fill.onnx")], ["overflow_fill.onnx", "too many elements"], 200 * MIB)
        # ... and one that would fit the virtual memory heuristic but not a 4 GiB address-space
        # limit (ulimit -v): 6.4 GB.
        shape_model([40000, 40000], "large_fill.onnx")
        expect_error([exe, "run", str(d / "large_fill.onnx")], ["large_fill.onnx", "'fill'", "out of memory"], 200 * MIB,
                     limit_address_space=4 << 30)

        # A graph input declared with 10^12 elements, fed a small tensor.
        onnx.save(model([helper.make_node("Relu", ["x"], ["y"])],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10**6, 10**6])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), d / "huge_input.onnx")
        expect_error([exe, "run", str(d / "huge_input.onnx"), "-i", f"x={d / 'x.npy'}"],
                     ["huge_input.onnx", "input 'x'", "float32[1000000,1000000]"], 200 * MIB)

        # Subgraphs nested 10^4 deep: protobuf's recursion limit refuses them while parsing.
        (d / "deep.onnx").write_bytes(nested_if_model(10_000))
        for command in ("run", "check", "info"):
            cmd = [exe, command, str(d / "deep.onnx")] + (["-i", f"c={d / 'c.npy'}", "-i", f"x={d / 'x.npy'}"] if command == "run" else [])
            expect_error(cmd, ["deep.onnx", "not a valid ONNX model", "more than 100 deep"], 200 * MIB)
        # ... while 25 levels load and run.
        (d / "nested.onnx").write_bytes(nested_if_model(25))
        code, output, _, _ = run_measured([exe, "run", str(d / "nested.onnx"), "-i", f"c={d / 'c.npy'}", "-i", f"x={d / 'x.npy'}"], 60)
        assert code == 0 and "y25: float32[1] = [1.5]" in output, output
        print("ok   25 nested If subgraphs run")

        # A 3 GB file: refused by its size before anything is read (a sparse file: no disk used).
        with open(d / "three_gb.onnx", "wb") as f:
            f.truncate(3 << 30)
        for command in ("run", "check", "info"):
            expect_error([exe, command, str(d / "three_gb.onnx")], ["three_gb.onnx", "over protobuf's 2 GiB limit"], 100 * MIB)

        # 10^6 nodes: checked and run, in bounded time and memory (planning was quadratic: a chain
        # of 10^5 nodes took 140 s and 24 GB; 10^6 now takes ~30 s and ~1.1 GB here).
        (d / "chain.onnx").write_bytes(chain_model(args.nodes))
        for command, limit in (("check", 3 << 30), ("run", 2 << 30)):
            cmd = [exe, command, str(d / "chain.onnx")] + (["-i", f"t0={d / 't0.npy'}"] if command == "run" else [])
            code, output, rss, seconds = run_measured(cmd, 300)
            assert code == 0, f"{command} of {args.nodes} nodes: exit {code}\n{output}"
            if command == "run":
                assert f"t{args.nodes}: float32[4] = [0, 0, 2, 0]" in output, output
            assert rss <= limit, f"{command} of {args.nodes} nodes: peak RSS {rss / MIB:.0f} MiB"
            print(f"ok   {command} of a {args.nodes}-node chain: {seconds:.1f} s, peak RSS {rss / MIB:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
