"""Writes the ONNX backend node tests of the installed onnx release as test data folders.

The onnx wheel ships its model tests (light, simple, pytorch-converted, pytorch-operator,
real) as data, but its node tests only as the Python cases that produce them
(onnx.backend.test.case.node). This script runs those cases and writes each as the usual
folder: model.onnx and test_data_set_N/{input,output}_M.pb, the layout of ONNX's own
`backend-test-tools generate-data` and of Debian's libonnx-testdata.

Usage: .venv/bin/python tests/conformance/generate_node_data.py OUT_DIR
Writes OUT_DIR/node/<test>/..., then OUT_DIR/node/.complete holding the onnx version (the
runner and scripts skip the generation when it matches).
"""

import os
import shutil
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper


def to_proto(value, value_type: onnx.TypeProto, name: str):
    """The serialized form of one input or output, by the graph's declared type."""
    if value_type.HasField("sequence_type"):
        return numpy_helper.from_list(value, name)
    if value_type.HasField("optional_type"):
        return numpy_helper.from_optional(value, name)
    if value_type.HasField("map_type"):
        return numpy_helper.from_dict(value, name)
    if isinstance(value, TensorProto):
        return value
    return numpy_helper.from_array(np.asarray(value), name)


def write_case(case, out_dir: str) -> None:
    folder = os.path.join(out_dir, case.kind, case.name)
    os.makedirs(folder)
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(case.model.SerializeToString())
    graph = case.model.graph
    for i, (inputs, outputs) in enumerate(case.data_sets):
        data = os.path.join(folder, f"test_data_set_{i}")
        os.makedirs(data)
        for kind, values, declared in (("input", inputs, graph.input), ("output", outputs, graph.output)):
            for j, value in enumerate(values):
                proto = to_proto(value, declared[j].type, declared[j].name)
                with open(os.path.join(data, f"{kind}_{j}.pb"), "wb") as f:
                    f.write(proto.SerializeToString())


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = sys.argv[1]
    node_dir = os.path.join(out_dir, "node")
    stamp = os.path.join(node_dir, ".complete")
    if os.path.exists(stamp) and open(stamp).read().strip() == onnx.__version__:
        return 0
    shutil.rmtree(node_dir, ignore_errors=True)
    from onnx.backend.test.case import node  # imported late: collecting runs every case

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    for case in cases:
        write_case(case, out_dir)
    with open(stamp, "w") as f:
        f.write(onnx.__version__ + "\n")
    print(f"generate_node_data: {len(cases)} node tests of onnx {onnx.__version__} in {node_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
