#!/usr/bin/env bash
# Command-line behaviour of `onnxtrain`: exit codes (0 ok, 2 bad input) and messages.
# Usage: cli_test.sh PATH/TO/onnxtrain
set -uo pipefail
bin=$1
python=${ONNXTRAIN_PYTHON:?set ONNXTRAIN_PYTHON to the .venv/bin/python of the project}
data=/usr/share/libonnx-testdata/data
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect STATUS PATTERN -- command...: runs the command, checks its exit status and that its
# combined output matches the extended regex PATTERN.
expect() {
  local status=$1 pattern=$2
  shift 3
  local out
  out=$("$@" 2>&1)
  local got=$?
  if [[ $got -ne $status ]] || ! grep -Eq -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> exit $got (want $status), output:"
    echo "$out" | head -20
    failures=$((failures + 1))
  else
    echo "ok: $*"
  fi
}

relu=$data/node/test_relu
expect 0 'opsets: ai.onnx' -- "$bin" info "$relu/model.onnx"
expect 0 'x  float32\[3,4,5\]' -- "$bin" info "$relu/model.onnx"
expect 0 '^ok: .*valid' -- "$bin" check "$relu/model.onnx"

printf 'not a model' >"$tmp/garbage.onnx"
expect 2 "error: .*garbage.onnx.*not a valid ONNX model" -- "$bin" check "$tmp/garbage.onnx"
expect 2 "error: .*missing.onnx: no such file" -- "$bin" info "$tmp/missing.onnx"

expect 0 'y: float32\[3,4,5\]' -- "$bin" run "$relu/model.onnx" --input "x=$relu/test_data_set_0/input_0.pb" --output-dir "$tmp/out"
[[ -f $tmp/out/y.npy ]] || { echo "FAIL: run did not write y.npy"; failures=$((failures + 1)); }
expect 2 "missing feed for input 'x'" -- "$bin" run "$relu/model.onnx"
# ONNXTRAIN_PROFILE=1: kernel times per op type and per node at exit.
expect 0 'Relu +[0-9.]+ +100.0% +1' -- env ONNXTRAIN_PROFILE=1 "$bin" run "$relu/model.onnx" --input "x=$relu/test_data_set_0/input_0.pb" --output-dir "$tmp/out"
expect 2 "expected NAME=FILE" -- "$bin" run "$relu/model.onnx" --input "x"
expect 2 "'z' is not an input" -- "$bin" run "$relu/model.onnx" --input "x=$relu/test_data_set_0/input_0.pb" --input "z=$relu/test_data_set_0/input_0.pb"
expect 2 "must be .npy or .pb" -- "$bin" run "$relu/model.onnx" --input "x=$tmp/garbage.onnx"
expect 2 "." -- "$bin" frobnicate

# Values beyond numeric tensors: a sequence input read from a SequenceProto file and written
# back as .pb, string tensors, and bfloat16 inputs that the test data stores as uint16 bits.
seq=$data/node/test_identity_sequence
expect 0 'y: sequence\(float32\) of 2: \[float32\[1,1,2,2\]' -- "$bin" run "$seq/model.onnx" --input "x=$seq/test_data_set_0/input_0.pb" --output-dir "$tmp/seq"
[[ -f $tmp/seq/y.pb ]] || { echo "FAIL: run did not write the sequence y.pb"; failures=$((failures + 1)); }
strnorm=$data/simple/test_strnorm_model_monday_casesensintive_upper
expect 0 'y: string\[3\] = \["TUESDAY", "WEDNESDAY", "THURSDAY"\]' -- "$bin" run "$strnorm/model.onnx" --input "x=$strnorm/test_data_set_0/input_0.pb" --output-dir "$tmp/str"
[[ -f $tmp/str/y.pb ]] || { echo "FAIL: run did not write the string tensor y.pb"; failures=$((failures + 1)); }
bf16=$data/node/test_cast_BFLOAT16_to_FLOAT
expect 0 'output: float32\[3,4\]' -- "$bin" run "$bf16/model.onnx" --input "input=$bf16/test_data_set_0/input_0.pb"

# Training from the command line: the linear-regression example.
examples=$(cd "$(dirname "$0")/../../examples" && pwd)
"$python" "$examples/linear_regression/make_model.py" "$tmp/lr" >/dev/null
expect 0 'update_binding W float32\[3,1\] <- W_new' -- "$bin" info "$tmp/lr/model.onnx"
expect 0 'ok: .*1 training_info' -- "$bin" check "$tmp/lr/model.onnx"
expect 0 'step 20  loss=' -- "$bin" step "$tmp/lr/model.onnx" --input "X=$tmp/lr/x.npy" --input "Y_true=$tmp/lr/y.npy" --initialize --steps 20 -o "$tmp/lr/trained.onnx"
losses=$("$bin" step "$tmp/lr/model.onnx" --input "X=$tmp/lr/x.npy" --input "Y_true=$tmp/lr/y.npy" --steps 20 -o "$tmp/lr/trained.onnx" | sed -n 's/.*loss=\([^ ]*\).*/\1/p')
first=$(head -1 <<<"$losses"); last=$(tail -1 <<<"$losses")
if ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a / 10) }'; then
  echo "FAIL: step: the loss did not fall tenfold in 20 steps ($first -> $last)"
  failures=$((failures + 1))
else
  echo "ok: step: loss $first -> $last"
fi
expect 2 "missing feed for input 'Y_true'" -- "$bin" step "$tmp/lr/model.onnx" --input "X=$tmp/lr/x.npy" -o "$tmp/lr/t.onnx"
[[ ! -e $tmp/lr/t.onnx ]] || { echo "FAIL: a failed step wrote a model"; failures=$((failures + 1)); }

# make-trainable, train, export; SIGINT during train writes a checkpoint and exits 130.
"$python" - "$tmp/mt" <<'PY'
import os, sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
out = sys.argv[1]
os.makedirs(out + "/data", exist_ok=True)
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "W")
graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["logits"])], "linear",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], [w])
onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out + "/model.onnx")
np.save(out + "/data/x.npy", rng.normal(size=(64, 4)).astype(np.float32))
np.save(out + "/data/label.npy", rng.integers(0, 3, size=64))
PY
expect 0 'trains W' -- "$bin" make-trainable "$tmp/mt/model.onnx" -o "$tmp/mt/train.onnx" --optimizer adam
# Weights in external data (torch.onnx.export's default), the model named without a folder.
"$python" -c "import onnx, sys; onnx.save(onnx.load(sys.argv[1]), sys.argv[2], save_as_external_data=True, size_threshold=0)" "$tmp/mt/model.onnx" "$tmp/mt/external.onnx"
expect 0 'trains W' -- bash -c 'cd "$1" && "$2" make-trainable external.onnx -o external_train.onnx' _ "$tmp/mt" "$(realpath "$bin")"
expect 0 'trains W' -- "$bin" make-trainable "$tmp/mt/external.onnx" -o "$tmp/external_train.onnx"
expect 0 'wrote .*external_inference.onnx' -- bash -c 'cd "$1" && "$2" export external.onnx -o external_inference.onnx' _ "$tmp/mt" "$(realpath "$bin")"
expect 2 'already has training_info' -- "$bin" make-trainable "$tmp/mt/train.onnx" -o "$tmp/mt/again.onnx"
expect 2 "'hinge' is not one of bce_with_logits, cross_entropy, l1, mse, nll" -- "$bin" make-trainable "$tmp/mt/model.onnx" -o "$tmp/mt/x.onnx" --loss hinge
# make-trainable's parameter groups and schedulers: specs parsed, bad ones named.
expect 0 'trains W' -- "$bin" make-trainable "$tmp/mt/model.onnx" -o "$tmp/mt/groups.onnx" --optimizer nesterov --param-group 'W:lr=0.5,momentum=0.5,nesterov=true' --lr-schedule sequential --scheduler linear:start_factor=0.1,total_iters=5 --scheduler 'multistep:milestones=2,4,gamma=0.5' --milestones 5
expect 2 "'betas' is not a parameter group key" -- "$bin" make-trainable "$tmp/mt/model.onnx" -o "$tmp/mt/x.onnx" --param-group 'W:betas=0.9'
expect 2 "is not of the form REGEX:key=value" -- "$bin" make-trainable "$tmp/mt/model.onnx" -o "$tmp/mt/x.onnx" --param-group W
expect 2 "lr=fast is not a number" -- "$bin" make-trainable "$tmp/mt/model.onnx" -o "$tmp/mt/x.onnx" --param-group 'W:lr=fast'
expect 2 "param_groups\[0\] pattern 'V' matches no trainable initializer" -- "$bin" make-trainable "$tmp/mt/model.onnx" -o "$tmp/mt/x.onnx" --param-group 'V:lr=0.1'
expect 2 "'cyclic' is not one of constant" -- "$bin" make-trainable "$tmp/mt/model.onnx" -o "$tmp/mt/x.onnx" --lr-schedule sequential --scheduler cyclic:gamma=0.5
expect 2 "onecycle needs max_lr" -- "$bin" make-trainable "$tmp/mt/model.onnx" -o "$tmp/mt/x.onnx" --lr-schedule onecycle --total-steps 10
[[ ! -e $tmp/mt/x.onnx ]] || { echo "FAIL: make-trainable wrote a model for bad options"; failures=$((failures + 1)); }
# A model make-trainable cannot train (Unique has no gradient rule) gets an error and no file.
"$python" - "$tmp/mt" <<'PY'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
w = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Unique", ["h"], ["u"], sorted=0),
         helper.make_node("ReduceSum", ["u"], ["s"], keepdims=1), helper.make_node("Add", ["h", "s"], ["logits"])]
g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], [w])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1] + "/unique.onnx")
PY
expect 2 "no gradient rule|not differentiable|Unique" -- "$bin" make-trainable "$tmp/mt/unique.onnx" -o "$tmp/mt/unique_train.onnx"
[[ ! -e $tmp/mt/unique_train.onnx ]] || { echo "FAIL: make-trainable wrote a model it could not train"; failures=$((failures + 1)); }
expect 0 'trained 4 steps' -- "$bin" train "$tmp/mt/train.onnx" --data "$tmp/mt/data" --batch-size 16 -o "$tmp/mt/trained.onnx"
# The training metadata (onnxtrain.training): make-trainable writes it, train updates its
# progress, info shows it; checkpoint import/export belong to the Python package's command.
expect 0 'optimizer: Adam \(torch.optim\), 1 param_groups' -- "$bin" info "$tmp/mt/train.onnx"
expect 0 'param_groups\[0\]: betas=\[0.9,0.999\] eps=1e-08 lr=0.01 weight_decay=0.0; 1 params' -- "$bin" info "$tmp/mt/train.onnx"
expect 0 'progress: epochs_done 0, global_step 0, batch_size -' -- "$bin" info "$tmp/mt/train.onnx"
expect 0 'progress: epochs_done 1, global_step 4, batch_size 16, seed 0, data .*mt/data' -- "$bin" info "$tmp/mt/trained.onnx"
expect 0 'written by: make-trainable, train' -- "$bin" info "$tmp/mt/trained.onnx"
expect 0 'lr_scheduler: SequentialLR milestones=\[5\] schedulers=' -- "$bin" info "$tmp/mt/groups.onnx"
expect 2 'import-checkpoint needs PyTorch: use the Python package' -- "$bin" import-checkpoint "$tmp/mt/train.onnx" -o "$tmp/mt/x.onnx"
expect 2 'export-checkpoint needs PyTorch' -- "$bin" export-checkpoint "$tmp/mt/train.onnx" -o "$tmp/mt/x"
expect 0 'wrote .*inference.onnx' -- "$bin" export "$tmp/mt/trained.onnx" -o "$tmp/mt/inference.onnx"
expect 0 'checker ok' -- "$python" -c "import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1])); print('checker ok')" "$tmp/mt/inference.onnx"
expect 0 'logits: float32\[64,3\]' -- "$bin" run "$tmp/mt/inference.onnx" --input "x=$tmp/mt/data/x.npy"
# Weights as safetensors: export --weights, load-weights; bad files are exit 2 and write nothing.
st=$tmp/mt/st
mkdir -p "$st"
expect 0 'wrote .*w.safetensors \(1 tensors\)' -- "$bin" export "$tmp/mt/trained.onnx" --weights "$st/w.safetensors"
[[ ! -e $tmp/mt/trained.inference.onnx ]] || { echo "FAIL: export --weights wrote a model"; failures=$((failures + 1)); }
expect 0 'wrote .*ws.safetensors \(4 tensors\)' -- "$bin" export "$tmp/mt/trained.onnx" --weights "$st/ws.safetensors" --optimizer-state -o "$st/inference.onnx"
expect 2 'error: export: give -o/--output' -- "$bin" export "$tmp/mt/trained.onnx"
expect 2 'error: export: --optimizer-state needs --weights' -- "$bin" export "$tmp/mt/trained.onnx" -o "$st/x.onnx" --optimizer-state
expect 0 'wrote .*loaded.onnx \(1 of 1 initializers replaced' -- "$bin" load-weights "$tmp/mt/model.onnx" --weights "$st/w.safetensors" -o "$st/loaded.onnx"
expect 0 'wrote .*state.onnx \(4 of 4 initializers replaced' -- "$bin" load-weights "$tmp/mt/train.onnx" --weights "$st/ws.safetensors" -o "$st/state.onnx"
# The Python safetensors package reads what export wrote; load-weights put the trained W (and
# Adam's state) in place; bad files for load-weights.
expect 0 'safetensors ok' -- "$python" - "$tmp/mt" <<'PY'
import sys
import numpy as np
import onnx
from onnx import numpy_helper
from safetensors.numpy import load_file, save_file
mt = sys.argv[1]
trained = onnx.load(mt + "/trained.onnx")
inits = {t.name: numpy_helper.to_array(t) for t in trained.graph.initializer}
inits.update({t.name: numpy_helper.to_array(t) for t in trained.training_info[0].algorithm.initializer})
w = load_file(mt + "/st/w.safetensors")
assert list(w) == ["W"] and np.array_equal(w["W"], inits["W"]), w
ws = load_file(mt + "/st/ws.safetensors")
assert sorted(ws) == ["W", "onnxtrain.adam_m.W", "onnxtrain.adam_v.W", "onnxtrain.step"], sorted(ws)
for name, value in ws.items():
    assert value.dtype == inits[name].dtype and np.array_equal(value, inits[name]), name
loaded = onnx.load(mt + "/st/loaded.onnx")
assert np.array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), inits["W"])
state = onnx.load(mt + "/st/state.onnx")
got = {t.name: numpy_helper.to_array(t) for t in state.training_info[0].algorithm.initializer}
assert np.array_equal(got["onnxtrain.adam_v.W"], inits["onnxtrain.adam_v.W"])
assert np.array_equal(got["onnxtrain.step"], inits["onnxtrain.step"])
onnx.checker.check_model(loaded)
W = inits["W"]
save_file({"W": W, "V": W}, mt + "/st/extra.safetensors")
save_file({"W": W.T.copy()}, mt + "/st/shape.safetensors")
save_file({"W": W.astype(np.float64)}, mt + "/st/dtype.safetensors")
data = open(mt + "/st/w.safetensors", "rb").read()
open(mt + "/st/truncated.safetensors", "wb").write(data[:-5])
open(mt + "/st/huge.safetensors", "wb").write((1 << 63).to_bytes(8, "little") + data[8:])
print("safetensors ok")
PY
expect 2 "error: .*extra.safetensors: tensor 'V' is no initializer of .*model.onnx" -- "$bin" load-weights "$tmp/mt/model.onnx" --weights "$st/extra.safetensors" -o "$st/bad.onnx"
expect 2 "error: .*shape.safetensors: tensor 'W' is float32\[3,4\], but the initializer in .*model.onnx is float32\[4,3\]" -- "$bin" load-weights "$tmp/mt/model.onnx" --weights "$st/shape.safetensors" -o "$st/bad.onnx"
expect 2 "error: .*dtype.safetensors: tensor 'W' is float64\[4,3\]" -- "$bin" load-weights "$tmp/mt/model.onnx" --weights "$st/dtype.safetensors" -o "$st/bad.onnx"
expect 2 "error: .*truncated.safetensors: tensor 'W': data_offsets \[0,48\] ends beyond the buffer" -- "$bin" load-weights "$tmp/mt/model.onnx" --weights "$st/truncated.safetensors" -o "$st/bad.onnx"
expect 2 "error: .*huge.safetensors: the header length 9223372036854775808 is above the limit" -- "$bin" load-weights "$tmp/mt/model.onnx" --weights "$st/huge.safetensors" -o "$st/bad.onnx"
expect 2 "error: .*missing.safetensors: no such file" -- "$bin" load-weights "$tmp/mt/model.onnx" --weights "$st/missing.safetensors" -o "$st/bad.onnx"
[[ ! -e $st/bad.onnx ]] || { echo "FAIL: load-weights wrote a model from a bad file"; failures=$((failures + 1)); }
expect 0 '1 of 1 initializers replaced .*, 1 tensors of the file skipped' -- "$bin" load-weights "$tmp/mt/model.onnx" --weights "$st/extra.safetensors" -o "$st/extra.onnx" --allow-extra
expect 2 'reads no column' -- "$bin" train "$tmp/mt/train.onnx" --data "$tmp/mt/data" --map label=nothing -o "$tmp/mt/t.onnx"
"$bin" train "$tmp/mt/train.onnx" --data "$tmp/mt/data" --batch-size 1 --epochs 1000000 -o "$tmp/mt/long.onnx" -q &
pid=$!
sleep 2
kill -INT $pid
wait $pid
status=$?
if [[ $status -ne 130 || ! -f $tmp/mt/long.ckpt.onnx ]]; then
  echo "FAIL: train after SIGINT exited $status (want 130) with checkpoint $(ls "$tmp/mt")"
  failures=$((failures + 1))
else
  echo "ok: train after SIGINT exited 130 and wrote $(basename "$tmp/mt/long.ckpt.onnx")"
  expect 0 'trained' -- "$bin" train "$tmp/mt/train.onnx" --resume "$tmp/mt/long.ckpt.onnx" --data "$tmp/mt/data" --batch-size 1 --max-steps 5 -o "$tmp/mt/resumed.onnx"
fi

if ((failures > 0)); then
  echo "$failures CLI check(s) failed"
  exit 1
fi
echo "all CLI checks passed"
