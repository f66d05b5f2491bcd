"""ResNet-18/50 and MobileNetV2 written in plain torch (no torchvision), for tests."""

import torch
from torch import nn


def _conv_bn(cin, cout, k, stride=1, groups=1, act=nn.ReLU):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, cout, 3, stride), _conv_bn(cout, cout, 3, act=None))
        self.short = None if stride == 1 and cin == cout else _conv_bn(cin, cout, 1, stride, act=None)

    def forward(self, x):
        return torch.relu(self.body(x) + (x if self.short is None else self.short(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(_conv_bn(cin, width, 1), _conv_bn(width, width, 3, stride),
                                  _conv_bn(width, cout, 1, act=None))
        self.short = None if stride == 1 and cin == cout else _conv_bn(cin, cout, 1, stride, act=None)

    def forward(self, x):
        return torch.relu(self.body(x) + (x if self.short is None else self.short(x)))


class ResNet(nn.Module):
    def __init__(self, block, layers, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2 ** i
            for j in range(n):
                blocks.append(block(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [_conv_bn(cin, hidden, 1, act=nn.ReLU6)]
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6), _conv_bn(hidden, cout, 1, act=None)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    def __init__(self, classes=1000):
        super().__init__()
        cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
               (6, 320, 1, 1)]
        layers, cin = [_conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, c, n, s in cfg:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def randomized(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random BatchNorm statistics and affine parameters (default ones would hide folding bugs)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(c, generator=g) * 0.1)
    return model.eval()


def resnet18():
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50():
    return ResNet(Bottleneck, [3, 4, 6, 3])
