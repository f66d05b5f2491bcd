"""Real architectures as users have them, for tests and ``bench/architectures.py``.

``transformers`` models built from small configs (random weights, no download):
MobileNetV2, ConvNeXt, ViT, Llama, Qwen2; and two exported ONNX models in the style of
common detectors and OCR networks (torch-built, exported with dynamic batch and image
axes, as exporters write them): an FPN detector (HardSwish, LeakyReLU, nearest
upsampling, a transposed-convolution head) and a DBNet-style text detector (PReLU,
HardSigmoid, bilinear upsampling, concat, two transposed convolutions).

Each builder returns ``(module, example_inputs)``; the module returns one tensor.
"""

from __future__ import annotations

import torch
import transformers


class LastHiddenState(torch.nn.Module):
    """A ``transformers`` base model reduced to its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).last_hidden_state


def calibrated(module, shape):
    """``module`` with the BatchNorm statistics of eight seeded random inputs, in eval
    mode. Random weights with the initial statistics (mean 0, variance 1) shrink the
    activations layer by layer (MobileNetV2's output is ~1e-24), and a wrong compiler
    matches a vanishing output; measured statistics keep every layer near unit scale."""
    norms = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # the cumulative average over the calibration batch
    module.train()
    with torch.no_grad():
        module(torch.randn(8, *shape[1:], generator=torch.Generator().manual_seed(1)))
    return module.eval()


def mobilenet_v2(image=64, depth_multiplier=0.35):
    cfg = transformers.MobileNetV2Config(image_size=image, depth_multiplier=depth_multiplier)
    shape = (1, 3, image, image)
    return LastHiddenState(calibrated(transformers.MobileNetV2Model(cfg), shape)), (torch.randn(*shape),)


def convnext(image=64, hidden_sizes=(16, 32, 64, 128)):
    """One block a stage, layer scale 0.5 (at the default 1e-6 each block adds almost
    nothing to its residual) and random LayerNorm parameters (the identity gamma and zero
    beta would hide a normalization over the wrong axis)."""
    cfg = transformers.ConvNextConfig(image_size=image, num_stages=len(hidden_sizes), hidden_sizes=list(hidden_sizes),
                                      depths=[1] * len(hidden_sizes), layer_scale_init_value=0.5)
    model = transformers.ConvNextModel(cfg).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return LastHiddenState(model).eval(), (torch.randn(1, 3, image, image),)


def vit(image=32, patch=8, hidden=64, layers=2, heads=4):
    cfg = transformers.ViTConfig(image_size=image, patch_size=patch, hidden_size=hidden, num_hidden_layers=layers,
                                 num_attention_heads=heads, intermediate_size=2 * hidden)
    return LastHiddenState(transformers.ViTModel(cfg, add_pooling_layer=False).eval()), (torch.randn(1, 3, image, image),)


def _decoder(config_cls, model_cls, hidden, layers, heads, kv_heads, seq, vocab):
    cfg = config_cls(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                     num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                     max_position_embeddings=4 * seq)
    return LastHiddenState(model_cls(cfg).eval()), (torch.randint(0, vocab, (1, seq)),)


def llama(hidden=64, layers=2, heads=4, kv_heads=2, seq=16, vocab=100):
    return _decoder(transformers.LlamaConfig, transformers.LlamaModel, hidden, layers, heads, kv_heads, seq, vocab)


def qwen2(hidden=64, layers=2, heads=4, kv_heads=2, seq=16, vocab=100):
    return _decoder(transformers.Qwen2Config, transformers.Qwen2Model, hidden, layers, heads, kv_heads, seq, vocab)


def _conv_bn(cin, cout, k=3, stride=1, act=None):
    layers = [torch.nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), torch.nn.BatchNorm2d(cout)]
    return torch.nn.Sequential(*layers, act if act is not None else torch.nn.Identity())


class FPNDetector(torch.nn.Module):
    """A small one-stage detector: a HardSwish backbone at strides 4, 8 and 16, an FPN
    with nearest 2x upsampling and LeakyReLU lateral convolutions, and a head that
    upsamples the finest level with a transposed convolution before the class and box
    convolutions."""

    def __init__(self, width=16, classes=5):
        super().__init__()
        w = width
        self.stem = torch.nn.Sequential(_conv_bn(3, w, stride=2, act=torch.nn.Hardswish()),
                                        _conv_bn(w, w, stride=2, act=torch.nn.Hardswish()))
        self.c3 = _conv_bn(w, 2 * w, stride=2, act=torch.nn.Hardswish())
        self.c4 = _conv_bn(2 * w, 4 * w, stride=2, act=torch.nn.Hardswish())
        self.lat4 = torch.nn.Sequential(torch.nn.Conv2d(4 * w, 2 * w, 1), torch.nn.LeakyReLU(0.1))
        self.lat3 = torch.nn.Sequential(torch.nn.Conv2d(2 * w, 2 * w, 1), torch.nn.LeakyReLU(0.1))
        self.up = torch.nn.Upsample(scale_factor=2, mode="nearest")
        self.deconv = torch.nn.ConvTranspose2d(2 * w, w, 4, stride=2, padding=1)
        self.cls = torch.nn.Conv2d(w, classes, 3, padding=1)
        self.box = torch.nn.Conv2d(w, 4, 3, padding=1)

    def forward(self, x):
        c2 = self.stem(x)
        c3 = self.c3(c2)
        c4 = self.c4(c3)
        p3 = self.lat3(c3) + self.up(self.lat4(c4))
        f = torch.nn.functional.hardswish(self.deconv(p3))
        return torch.cat([torch.sigmoid(self.cls(f)), self.box(f)], dim=1)


class DBNetText(torch.nn.Module):
    """A DBNet-style text detector (as PaddleOCR's detection models): a PReLU backbone,
    bilinear upsampling of every level to the finest, concat, and a probability head of
    two stride-2 transposed convolutions ending in a HardSigmoid."""

    def __init__(self, width=8):
        super().__init__()
        w = width
        self.s1 = _conv_bn(3, w, stride=2, act=torch.nn.PReLU(w))
        self.s2 = _conv_bn(w, 2 * w, stride=2, act=torch.nn.PReLU(2 * w))
        self.s3 = _conv_bn(2 * w, 4 * w, stride=2, act=torch.nn.PReLU(4 * w))
        self.in2 = torch.nn.Conv2d(2 * w, w, 1)
        self.in3 = torch.nn.Conv2d(4 * w, w, 1)
        self.head = torch.nn.Sequential(
            _conv_bn(2 * w, w, act=torch.nn.ReLU()),
            torch.nn.ConvTranspose2d(w, w, 2, stride=2), torch.nn.BatchNorm2d(w), torch.nn.ReLU(),
            torch.nn.ConvTranspose2d(w, 1, 2, stride=2), torch.nn.Hardsigmoid())

    def forward(self, x):
        f2 = self.s2(self.s1(x))
        f3 = self.s3(f2)
        up = torch.nn.functional.interpolate(self.in3(f3), scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.head(torch.cat([self.in2(f2), up], dim=1))


def detector(image=64):
    torch.manual_seed(0)
    shape = (1, 3, image, image)
    return calibrated(FPNDetector(), shape), (torch.randn(*shape),)


def text_detector(image=64):
    torch.manual_seed(0)
    shape = (1, 3, image, image)
    return calibrated(DBNetText(), shape), (torch.randn(*shape),)


def export_onnx(module, example_inputs, path, opset=17):
    """Export as deployment tools do: TorchScript exporter, batch and image axes dynamic."""
    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output": {0: "batch", 2: "oh", 3: "ow"}}
    with torch.no_grad():
        torch.onnx.export(module, example_inputs, path, input_names=["images"], output_names=["output"],
                          dynamic_axes=axes, opset_version=opset, dynamo=False)
    return path


TORCH = {"mobilenet_v2": mobilenet_v2, "convnext": convnext, "vit": vit, "llama": llama, "qwen2": qwen2}
ONNX = {"detector": detector, "text_detector": text_detector}
