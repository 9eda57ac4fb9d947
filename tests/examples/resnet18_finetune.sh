#!/usr/bin/env bash
# The resnet18 fine-tuning example (examples/resnet18/README.md) as its README runs it, with
# fewer steps: export torchvision's resnet18 from PyTorch, make it trainable, train it with
# `onnxtrain train` on 384 Fashion-MNIST images (12 steps of 32), and check that the loss falls:
# the mean of the last 4 step losses must be below the mean of the first 4.
# Usage: resnet18_finetune.sh ONNXTRAIN
set -euo pipefail
bin=$1
python=${ONNXTRAIN_PYTHON:?set ONNXTRAIN_PYTHON to the .venv/bin/python of the project}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$python" "$root/examples/resnet18/export_model.py" "$out" >/dev/null
"$bin" make-trainable "$out/resnet18_fmnist.onnx" -o "$out/resnet18_train.onnx" \
  --loss cross_entropy --optimizer momentum --lr 0.01 >/dev/null
"$bin" train "$out/resnet18_train.onnx" --data /usr/share/datasets/fashion-mnist --scale image=1/255 \
  --batch-size 32 --max-steps 12 --seed 0 -q --metrics "$out/metrics.jsonl" \
  -o "$out/resnet18_trained.onnx"
"$python" - "$out/metrics.jsonl" <<'PY'
import json, math, sys
losses = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if r["type"] == "step"]
print("step losses:", " ".join(f"{l:.3f}" for l in losses))
assert len(losses) == 12, f"expected 12 step records, got {len(losses)}"
assert all(math.isfinite(l) for l in losses), "a loss is not finite"
first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
assert last < first, f"the loss did not fall: first 4 steps {first:.4f}, last 4 {last:.4f}"
print(f"loss fell: first 4 steps {first:.4f} -> last 4 {last:.4f}")
PY
