"""Lays out the ONNX backend tests of the installed onnx release as one test data root.

The onnx wheel ships its model tests (simple, pytorch-converted, pytorch-operator) as data
folders, its node tests only as the Python cases that produce them (onnx.backend.test.case.node)
and its light models (light/*.onnx) with expected outputs but no inputs. This script writes
OUT_DIR/<folder>/<test>/model.onnx and test_data_set_N/{input,output}_M.pb, the layout of
ONNX's own `backend-test-tools generate-data` and of Debian's libonnx-testdata:
- node: each case of onnx.backend.test.case.node, run and written out;
- light: each light model with the input ONNX's backend runner feeds it (Runner.
  generate_dummy_data: arange(n) / n in the declared shape, unknown dims 1) and its shipped
  expected output;
- simple, pytorch-converted, pytorch-operator: links to the wheel's folders.
The "real" folder only names models to download and is left out.

Usage: .venv/bin/python tests/conformance/onnx_testdata.py OUT_DIR
OUT_DIR/.complete holds the onnx version once done; with the same version nothing is redone.
"""

import os
import shutil
import sys
import warnings

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

WHEEL_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
LINKED = ("simple", "pytorch-converted", "pytorch-operator")


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


def write_test(folder: str, model: onnx.ModelProto, data_sets) -> None:
    os.makedirs(folder)
    with open(os.path.join(folder, "model.onnx"), "wb") as f:
        f.write(model.SerializeToString())
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs_declared = [i for i in graph.input if i.name not in initializers]
    for i, (inputs, outputs) in enumerate(data_sets):
        data = os.path.join(folder, f"test_data_set_{i}")
        os.makedirs(data)
        for kind, values, declared in (("input", inputs, inputs_declared), ("output", outputs, graph.output)):
            for j, value in enumerate(values):
                proto = to_proto(value, declared[j].type, declared[j].name)
                with open(os.path.join(data, f"{kind}_{j}.pb"), "wb") as f:
                    f.write(proto.SerializeToString())


def write_node_tests(out_dir: str) -> int:
    from onnx.backend.test.case import node  # imported late: collecting runs every case

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases()
    for case in cases:
        write_test(os.path.join(out_dir, "node", case.name), case.model, case.data_sets)
    return len(cases)


def write_light_tests(out_dir: str) -> int:
    from onnx.backend.test.runner import Runner

    light = os.path.join(WHEEL_DATA, "light")
    count = 0
    for file in sorted(os.listdir(light)):
        if not file.endswith(".onnx"):
            continue
        name = file[: -len(".onnx")]
        model = onnx.load(os.path.join(light, file))
        initializers = {t.name for t in model.graph.initializer}
        inputs = [Runner.generate_dummy_data(x, seed=0, name=name, random=False)
                  for x in model.graph.input if x.name not in initializers]
        outputs = []
        for j in range(len(model.graph.output)):
            expected = onnx.load_tensor(os.path.join(light, f"{name}_output_{j}.pb"))
            outputs.append(numpy_helper.to_array(expected))
        write_test(os.path.join(out_dir, "light", name), model, [(inputs, outputs)])
        count += 1
    return count


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = sys.argv[1]
    stamp = os.path.join(out_dir, ".complete")
    if os.path.exists(stamp) and open(stamp).read().strip() == onnx.__version__:
        return 0
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    nodes = write_node_tests(out_dir)
    lights = write_light_tests(out_dir)
    for folder in LINKED:
        os.symlink(os.path.join(WHEEL_DATA, folder), os.path.join(out_dir, folder))
    with open(stamp, "w") as f:
        f.write(onnx.__version__ + "\n")
    print(f"onnx_testdata: onnx {onnx.__version__} backend tests in {out_dir}: {nodes} node, "
          f"{lights} light, and the wheel's {', '.join(LINKED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
