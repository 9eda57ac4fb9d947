"""The convolutional networks of the parity tests, written out in PyTorch (there is no CPU
build of torchvision for the project's environment).

- resnet18: examples/resnet18/resnet.py.
- mobilenet_v2: Sandler et al., "MobileNetV2: Inverted Residuals and Linear Bottlenecks"
  (2018), as torchvision builds it (width 1.0): a 3x3 stride-2 stem, 17 inverted residual
  blocks (1x1 expansion with ReLU6, 3x3 depthwise with ReLU6, 1x1 linear projection; a
  residual connection where stride is 1 and the widths match), a 1x1 convolution to 1280
  channels, global average pooling, dropout 0.2 and a linear classifier. Initialization as
  torchvision's: Kaiming-normal (fan_out) convolutions with zero bias, BatchNorm 1 and 0,
  Linear weights normal(0, 0.01) and zero bias.
"""
import os
import sys

from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "resnet18"))
from resnet import resnet18  # noqa: E402,F401  (re-exported)


def conv_bn_relu6(in_channels, out_channels, kernel, stride, groups=1):
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel, stride, (kernel - 1) // 2,
                                   groups=groups, bias=False),
                         nn.BatchNorm2d(out_channels), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, in_channels, out_channels, stride, expand_ratio):
        super().__init__()
        hidden = in_channels * expand_ratio
        layers = [] if expand_ratio == 1 else [conv_bn_relu6(in_channels, hidden, 1, 1)]
        layers += [conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, out_channels, 1, 1, 0, bias=False), nn.BatchNorm2d(out_channels)]
        self.conv = nn.Sequential(*layers)
        self.use_residual = stride == 1 and in_channels == out_channels

    def forward(self, x):
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    # expansion t, output channels c, repeats n, first stride s (the paper's Table 2)
    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, num_classes=1000):
        super().__init__()
        layers, channels = [conv_bn_relu6(3, 32, 3, 2)], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(channels, c, s if i == 0 else 1, t))
                channels = c
        layers.append(conv_bn_relu6(channels, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(self.pool(self.features(x)).flatten(1))


def mobilenet_v2(num_classes=1000):
    return MobileNetV2(num_classes)
