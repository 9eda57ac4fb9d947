"""The Python safetensors package (requirements.txt) as the peer of safetensors_test.cpp.

    safetensors_peer.py write DIR   writes DIR/py.safetensors with safetensors.torch.save_file
                                    and, per tensor, DIR/NAME.bin (its bytes from torch) and
                                    DIR/manifest.json {NAME: {"dtype": onnxtrain's name, "shape"}}
    safetensors_peer.py check DIR   loads DIR/cpp.safetensors with safetensors.torch.load_file and
                                    compares it with DIR/NAME.bin and DIR/manifest.json (written
                                    by the C++ test); exit 1 with a message on a difference

onnxtrain's dtype names are torch's without "torch." and underscores (float8_e4m3fn ->
float8e4m3fn), include/onnxtrain/dtype.h.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint64, torch.uint32, torch.uint16, torch.uint8, torch.bool,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
METADATA = {"format": "pt", "note": "written by safetensors_peer.py"}


def onnxtrain_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("_", "")


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def random_tensor(dtype: torch.dtype, shape: list[int], gen: torch.Generator) -> torch.Tensor:
    size = dtype.itemsize
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    data = torch.randint(0, 256, (n * size,), generator=gen, dtype=torch.uint8)
    return data.view(dtype).reshape(shape)


def write(folder: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors, manifest = {}, {}
    for i, dtype in enumerate(DTYPES):
        for suffix, shape in (("matrix", [3, i % 4 + 1]), ("scalar", []), ("empty", [0, 2])):
            name = f"{onnxtrain_name(dtype)}.{suffix}"
            tensors[name] = random_tensor(dtype, shape, gen)
            manifest[name] = {"dtype": onnxtrain_name(dtype), "shape": shape}
            (folder / f"{name}.bin").write_bytes(raw_bytes(tensors[name]))
    save_file(tensors, str(folder / "py.safetensors"), metadata=METADATA)
    (folder / "manifest.json").write_text(json.dumps({"tensors": manifest, "metadata": METADATA}))


def check(folder: Path) -> int:
    expected = json.loads((folder / "manifest.json").read_text())
    loaded = load_file(str(folder / "cpp.safetensors"))
    with safe_open(str(folder / "cpp.safetensors"), framework="pt") as f:
        metadata = f.metadata() or {}
    errors = []
    if metadata != expected["metadata"]:
        errors.append(f"metadata {metadata} != {expected['metadata']}")
    if sorted(loaded) != sorted(expected["tensors"]):
        errors.append(f"names {sorted(loaded)} != {sorted(expected['tensors'])}")
    for name, info in expected["tensors"].items():
        t = loaded.get(name)
        if t is None:
            continue
        if onnxtrain_name(t.dtype) != info["dtype"] or list(t.shape) != info["shape"]:
            errors.append(f"{name}: {t.dtype}{list(t.shape)} != {info['dtype']}{info['shape']}")
        elif raw_bytes(t) != (folder / f"{name}.bin").read_bytes():
            errors.append(f"{name}: the bytes differ")
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    mode, folder = sys.argv[1], Path(sys.argv[2])
    if mode == "write":
        write(folder)
        sys.exit(0)
    sys.exit(check(folder))
