#!/usr/bin/env python3
"""Writes resnet18_fmnist.onnx: ResNet-18 (resnet.py, as torchvision builds it; random initial weights, 10 classes) that
reads Fashion-MNIST images as they are, float32[N, 1, 28, 28], resizes them to 32x32
(bilinear, as torch.nn.functional.interpolate) and repeats the gray channel three times.

Exported with torch.onnx.export: opset 17, TrainingMode.TRAINING (BatchNormalization updates
its running statistics, as the model's outputs define), no constant folding, so the model is
what a user fine-tuning a PyTorch model would bring.

Usage: export_model.py OUT_DIR [--seed N]
"""
import argparse
import os
import warnings

import torch

from resnet import resnet18


class FashionResNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = resnet18(num_classes=10)

    def forward(self, image):
        x = torch.nn.functional.interpolate(image, size=(32, 32), mode="bilinear", align_corners=False)
        return self.net(x.expand(-1, 3, -1, -1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    # torch 1.13's exporter warns about its own shape inference; the model is checked by onnxtrain.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")
    torch.manual_seed(args.seed)
    model = FashionResNet()
    path = os.path.join(args.out_dir, "resnet18_fmnist.onnx")
    torch.onnx.export(model, (torch.rand(2, 1, 28, 28),), path, dynamo=False, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "N"}, "logits": {0: "N"}})
    print(path)


if __name__ == "__main__":
    main()
