"""The three workloads of issue 18 beyond the Fashion-MNIST MLP and CNN, for bench/workloads.py:
their PyTorch modules, the optimizer each trains with, and their ONNX export (their synthetic
data is bench/workload_data.py's, re-exported here).

- resnet18: ResNet-18 (examples/resnet18/resnet.py, torchvision's BasicBlock [2, 2, 2, 2] layout)
  on float32[N, 3, 32, 32] images, 10 classes, batch 32, SGD with momentum 0.9, lr 0.01.
- bert: transformers' BertForSequenceClassification from a BertConfig (4 layers, hidden 256,
  4 heads, intermediate 1024, dropout 0 so both sides compute the same function), int64
  input_ids[N, 128], 2 labels, batch 32, AdamW (lr 1e-4, weight_decay 0.01: PyTorch's default).
- lstm: a 2-layer torch.nn.LSTM (input 32, hidden 256, batch_first) on float32[N, 64, 32]; the
  last step's output -> Linear(256, 10); batch 64, Adam lr 1e-3.

Each export is torch.onnx.export's TorchScript exporter (dynamo=False), opset 17, no constant
folding, the batch dimension symbolic; one input and one output, `logits`. The model to train is
exported with TrainingMode.TRAINING (BatchNormalization in training mode), the inference model
with TrainingMode.EVAL.
"""
import os
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "resnet18"))
from resnet import ResNet18  # noqa: E402
from workload_data import BATCH, LSTM_INPUT, NUM_CLASSES, SEQUENCE, VOCAB, dataset, input_name, sample_input  # noqa: E402,F401

OPSET = 17
# onnxtrain make-trainable's --optimizer and its options, and the same optimizer in PyTorch.
OPTIMIZER = {
    "resnet18": (["--optimizer", "momentum", "--lr", "0.01", "--momentum", "0.9"],
                 lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9)),
    "bert": (["--optimizer", "adamw", "--lr", "1e-4", "--weight-decay", "0.01"],
             lambda params: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)),
    "lstm": (["--optimizer", "adam", "--lr", "1e-3"], lambda params: torch.optim.Adam(params, lr=1e-3)),
}


class BertLogits(torch.nn.Module):
    """BertForSequenceClassification returning the logits tensor alone (no attention mask: all ones)."""

    def __init__(self, attn_implementation=None):
        """attn_implementation: transformers' choice (None: its default, sdpa) or "eager" (the same
        products as separate matmuls, which torch.utils.flop_counter counts; on the CPU it does not
        count sdpa's kernel)."""
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification
        config = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2,
                            attn_implementation=attn_implementation)
        self.bert = BertForSequenceClassification(config)

    def forward(self, input_ids):
        return self.bert(input_ids=input_ids).logits


class LstmClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(LSTM_INPUT, 256, num_layers=2, batch_first=True)
        self.fc = torch.nn.Linear(256, 10)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def build(name, attn_implementation=None):
    """A freshly initialized module (seed 0); attn_implementation as BertLogits takes it."""
    torch.manual_seed(0)
    if name == "resnet18":
        return ResNet18(num_classes=10)
    if name == "bert":
        return BertLogits(attn_implementation)
    return LstmClassifier()


def export(name, path, training=True):
    """Writes the module's ONNX export to path: TrainingMode.TRAINING for make-trainable, else
    TrainingMode.EVAL (BatchNormalization reads its running statistics), the inference model."""
    model = build(name)
    model.train(training)
    example = torch.from_numpy(sample_input(name, 2, np.random.default_rng(1)))
    warnings.filterwarnings("ignore")
    torch.onnx.export(model, (example,), path, dynamo=False, opset_version=OPSET,
                      training=torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL,
                      do_constant_folding=False,
                      input_names=[input_name(name)], output_names=["logits"],
                      dynamic_axes={input_name(name): {0: "N"}, "logits": {0: "N"}})


def train_flops(name):
    """FLOPs (2 per multiply-add) of the matrix products and convolutions of one training step on a
    batch: forward and backward, no gradient for the input itself. ResNet-18 and BERT: counted by
    torch.utils.flop_counter.FlopCounterMode on the PyTorch module, BERT with transformers' eager
    attention (the counter does not count the CPU kernel of scaled_dot_product_attention, the
    default: until 2026-11-25 the attention's 6.4 of BERT's 83.8 GFLOP were left out; the same
    products as bench/gemm_peak.py reads from the ONNX export). The LSTM: from its equations
    (PyTorch's CPU LSTM kernel is one op the counter does not see): per layer of input size I,
    hidden H, 4 gates, S steps and batch N, forward 2 S N 4H (I + H); backward the weight
    gradients (as many), dH through R (2 S N 4H H) and, above the first layer, dX (2 S N 4H I)."""
    batch = BATCH[name]
    if name == "lstm":
        s, h, total = SEQUENCE["lstm"], 256, 0
        for layer, inputs in enumerate((LSTM_INPUT, h)):
            rows = 2 * s * batch * 4 * h
            total += 2 * rows * (inputs + h) + rows * h + (rows * inputs if layer > 0 else 0)
        return total + 3 * 2 * batch * h * NUM_CLASSES["lstm"]
    from torch.utils.flop_counter import FlopCounterMode
    model = build(name, attn_implementation="eager")
    model.train()
    x = torch.from_numpy(sample_input(name, batch, np.random.default_rng(0)))
    with FlopCounterMode(display=False) as counter:
        loss = torch.nn.functional.cross_entropy(model(x), torch.zeros(batch, dtype=torch.long))
        loss.backward()
    return counter.get_total_flops()
