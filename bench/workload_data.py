"""The synthetic data of bench/workload_models.py's workloads, with NumPy alone: the shapes, the
batch sizes and the inputs. Kept apart from the PyTorch modules so that bench/workload_infer.py,
started once per timed ONNX Runtime configuration, does not import torch (3.3 s a process on
the 2-core development VM, against 0.26 s for onnxruntime and NumPy).
"""
import numpy as np

NUM_CLASSES = {"resnet18": 10, "bert": 2, "lstm": 10}
BATCH = {"resnet18": 32, "bert": 32, "lstm": 64}
SEQUENCE = {"bert": 128, "lstm": 64}
VOCAB = 30522  # BertConfig's default vocab_size
LSTM_INPUT = 32


def input_name(name):
    return "input_ids" if name == "bert" else "x"


def sample_input(name, batch, rng):
    """Synthetic inputs of one batch as a NumPy array (deterministic given rng)."""
    if name == "resnet18":
        return rng.standard_normal((batch, 3, 32, 32), dtype=np.float32)
    if name == "bert":
        return rng.integers(0, VOCAB, (batch, SEQUENCE["bert"]), dtype=np.int64)
    return rng.standard_normal((batch, SEQUENCE["lstm"], LSTM_INPUT), dtype=np.float32)


def dataset(name, batches, seed=0):
    """{input name: array, "label": int64 array} with `batches` batches of synthetic samples."""
    rng = np.random.default_rng(seed)
    n = batches * BATCH[name]
    return {input_name(name): sample_input(name, n, rng),
            "label": rng.integers(0, NUM_CLASSES[name], n, dtype=np.int64)}
