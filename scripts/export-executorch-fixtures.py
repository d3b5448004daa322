"""Exports the programs of tests/data/executorch/export/ with ExecuTorch 1.5.1's XNNPACK lowering,
and records what ExecuTorch's own runtime (its XNNPACK backend) returns for them.

Run through scripts/export-executorch-fixtures.sh, which makes the pinned venv (executorch 1.5.1,
torch 2.14.1, torchao 0.18.0, torchvision 0.29.2). Tests never need torch: they read the files.

Per program NAME: NAME.pte, NAME.ptd (weights outside the program, where the delegate keeps them
as named data), and NAME.io.json in the layout of tests/data/executorch/runtime-c: steps of
inputs and outputs_et, each a raw little-endian C-order file with its dtype and shape. A program
with a KV cache runs several steps on one loaded method, so state carries over.

Weights are random (seeded) and widths small: each file stays under a few MiB.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim, export

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.passes.external_constants_pass import (
    delegate_external_constants_pass_unlifted,
)
from executorch.runtime import Runtime

DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}


def lower(model, inputs, name, out, external=True, dynamic_shapes=None):
    """Exports `model`, lowers it to XNNPACK, writes NAME.pte (and NAME.ptd), returns the paths."""
    if not isinstance(model, torch.fx.GraphModule):
        # A pt2e-quantized module is already in eval mode and refuses eval().
        model = model.eval()
    with torch.no_grad():
        if external:
            m = export(model, inputs, dynamic_shapes=dynamic_shapes, strict=False).module()
            delegate_external_constants_pass_unlifted(module=m, gen_tag_fn=lambda _n: name)
            ep = export(m, inputs, dynamic_shapes=dynamic_shapes, strict=False)
        else:
            ep = export(model, inputs, dynamic_shapes=dynamic_shapes, strict=False)
        prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    pte = os.path.join(out, name + ".pte")
    with open(pte, "wb") as f:
        prog.write_to_file(f)
    ptds = []
    if external:
        prog.write_tensor_data_to_file(out)
        ptd = os.path.join(out, name + ".ptd")
        if os.path.exists(ptd):
            ptds.append(ptd)
    return pte, ptds


def tensor_entry(out, name, tag, t):
    t = t.detach()
    # The bytes as they lie in memory, which is how ExecuTorch's runtime takes and gives them: a
    # channels-last tensor's in N, H, W, C order (its dim order), under its logical shape.
    channels_last = (
        t.dim() == 4
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    )
    shape = list(t.shape)
    t = t.permute(0, 2, 3, 1).contiguous() if channels_last else t.contiguous()
    path = os.path.join(out, f"{name}.{tag}.bin")
    if t.dtype == torch.bool:
        data = t.numpy().astype(np.uint8).tobytes()
    else:
        data = t.numpy().tobytes()
    with open(path, "wb") as f:
        f.write(data)
    entry = {"file": os.path.basename(path), "dtype": DTYPES[t.dtype], "shape": shape}
    if channels_last:
        entry["dim_order"] = [0, 2, 3, 1]
    return entry


def record(name, out, pte, ptds, steps, method="forward"):
    """Runs each step's inputs through ExecuTorch's runtime on one loaded method."""
    runtime = Runtime.get()
    program = runtime.load_program(pte, data_path=ptds[0] if ptds else None)
    m = program.load_method(method)
    io = {
        "program": os.path.basename(pte),
        "data": [os.path.basename(p) for p in ptds],
        "method": method,
        "steps": [],
    }
    for k, inputs in enumerate(steps):
        outputs = m.execute(list(inputs))
        io["steps"].append(
            {
                "inputs": [tensor_entry(out, name, f"s{k}.in{i}", t) for i, t in enumerate(inputs)],
                "outputs_et": [
                    tensor_entry(out, name, f"s{k}.out_et{j}", o) for j, o in enumerate(outputs)
                ],
            }
        )
    with open(os.path.join(out, name + ".io.json"), "w") as f:
        json.dump(io, f, indent=1)
    sizes = [os.path.getsize(p) for p in [pte] + ptds]
    print(f"{name}: {sizes} bytes, {len(steps)} step(s)", flush=True)


def export_one(out, name, model, inputs, steps=None, external=True, dynamic_shapes=None):
    pte, ptds = lower(model, inputs, name, out, external, dynamic_shapes)
    record(name, out, pte, ptds, steps or [inputs])


# ---- One program per node type (or small group) ----------------------------------------------


class Unary(nn.Module):
    """Every unary node ExecuTorch lowers, one output each."""

    def forward(self, x):
        pos = x * x + 0.5
        return (
            torch.abs(x),
            torch.ceil(x),
            torch.floor(x),
            torch.exp(x),
            torch.log(pos),
            torch.neg(x),
            torch.sigmoid(x),
            torch.tanh(x),
            torch.sqrt(pos),
            torch.rsqrt(pos),
            torch.pow(x, 2),
            F.gelu(x),
            F.hardswish(x),
            F.leaky_relu(x, 0.07),
            torch.sin(x),
            torch.cos(x),
            F.relu(x),
            F.hardtanh(x, -0.5, 0.75),
            F.elu(x, 0.8),
        )


class Binary(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.prelu = nn.PReLU(channels)

    def forward(self, a, b, c):
        d = b.abs() + 0.5
        return (
            a + b,
            a - b,
            a * b,
            a / d,
            torch.minimum(a, b),
            torch.maximum(a, b),
            F.relu(a + b),
            self.prelu(c),
        )


class Pooling(nn.Module):
    def forward(self, x):
        return (
            F.max_pool2d(x, 3, 2, 1),
            F.max_pool2d(x, 2, 2, ceil_mode=True),
            F.max_pool2d(x, 3, 1, 1, dilation=1),
            F.avg_pool2d(x, 3, 1, 1),
            F.avg_pool2d(x, 2, 2),
            torch.mean(x, dim=(2, 3), keepdim=True),
            torch.amax(x, dim=3, keepdim=True),
        )


class ArgMax(nn.Module):
    """max.dim: lowered (as max pooling) only when its indices go unused; ExecuTorch 1.5.1's
    partitioner never lowers argmax pooling (MaxDimConfig: "as long as we don't return
    indices")."""

    def forward(self, x):
        values, _ = torch.max(x, dim=3, keepdim=True)
        return values


class Deconv(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.b = nn.ConvTranspose2d(6, 4, 2, stride=2, groups=2, bias=False)

    def forward(self, x):
        return self.b(F.relu(self.a(x)))


class PadResize(nn.Module):
    def forward(self, x):
        return (
            F.pad(x, (1, 2, 0, 1), value=0.5),
            F.interpolate(x, size=(11, 13), mode="bilinear", align_corners=False),
            F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=True),
        )


class Concat(nn.Module):
    def forward(self, a, b, c, d, e):
        return (
            torch.cat([a, b], dim=1),
            torch.cat([a, b, c], dim=1),
            torch.cat([a, b, c, d], dim=2),
            torch.cat([a, b, c, d, e], dim=3),
        )


class Shapes(nn.Module):
    """Copy, transpose, slice, reshape, softmax, bmm around a linear layer."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x).clone()
        t = y.transpose(1, 2)
        s = torch.bmm(y, t)
        return torch.softmax(s, dim=-1), y[:, 1:3, 2:6].reshape(2, -1)


class Attention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


# ---- Architectures --------------------------------------------------------------------------


class ConvChannelsLast(nn.Module):
    """A convolution whose input and output are channels-last tensors: ExecuTorch's backend binds
    them in memory order (N, H, W, C), and XNNPACK's graph declares them so."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


class UnusedInput(nn.Module):
    """`forward(x, unused, y)`, lowered whole (`to_backend`): the delegate call passes all three
    inputs and its graph has no value for `unused`, whose external id it skips."""

    def forward(self, x, unused, y):
        return x * y + x


def export_unused_input(out, name, inputs):
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend  # noqa: F401
    from executorch.exir import EdgeCompileConfig, to_edge
    from executorch.exir.backend.backend_api import to_backend

    config = EdgeCompileConfig(_check_ir_validity=False)
    with torch.no_grad():
        edge = to_edge(export(UnusedInput().eval(), inputs, strict=False), compile_config=config)
        lowered = to_backend("XnnpackBackend", edge.exported_program(), [])

        class Call(nn.Module):
            def __init__(self):
                super().__init__()
                self.lowered = lowered

            def forward(self, x, unused, y):
                return self.lowered(x, unused, y)

        prog = to_edge(export(Call(), inputs, strict=False), compile_config=config).to_executorch()
    pte = os.path.join(out, name + ".pte")
    with open(pte, "wb") as f:
        prog.write_to_file(f)
    record(name, out, pte, [], [inputs])


def tiny_resnet(num_classes=10):
    from torchvision.models.resnet import BasicBlock

    class TinyResNet(nn.Module):
        """ResNet-18's shape (a stem, four stages of two basic blocks) at widths 16 to 128."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
            layers, inplanes = [], 16
            for i, planes in enumerate([16, 32, 64, 128]):
                stride = 1 if i == 0 else 2
                down = None
                if stride != 1 or inplanes != planes:
                    down = nn.Sequential(
                        nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
                    )
                layers += [BasicBlock(inplanes, planes, stride, down), BasicBlock(planes, planes)]
                inplanes = planes
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(128, num_classes)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    return TinyResNet()


class TinyViT(nn.Module):
    def __init__(self, d=64, patch=8, image=32, layers=2, classes=10):
        super().__init__()
        self.embed = nn.Conv2d(3, d, patch, patch)
        n = (image // patch) ** 2
        self.pos = nn.Parameter(torch.randn(1, n, d) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d, 4, 2 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        x = self.encoder(x)
        return self.head(self.norm(x).mean(dim=1))


class TinyUNet(nn.Module):
    """An encoder-decoder with max pooling, a transposed convolution, a skip concatenation,
    bilinear upsampling and padding."""

    def __init__(self):
        super().__init__()
        self.enc1 = nn.Conv2d(3, 8, 3, padding=1)
        self.enc2 = nn.Conv2d(8, 16, 3, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Conv2d(16, 8, 3, padding=1)
        self.out = nn.Conv2d(8, 2, 3)

    def forward(self, x):
        e1 = F.relu(self.enc1(x))
        e2 = F.relu(self.enc2(F.max_pool2d(e1, 2)))
        u = self.up(e2)
        d = F.relu(self.dec(torch.cat([u, e1], dim=1)))
        d = F.interpolate(d, scale_factor=2.0, mode="bilinear", align_corners=False)
        return self.out(F.pad(d, (1, 1, 1, 1)))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class DecoderLayer(nn.Module):
    def __init__(self, d, heads, hidden, max_len):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.register_buffer("k_cache", torch.zeros(1, heads, max_len, d // heads))
        self.register_buffer("v_cache", torch.zeros(1, heads, max_len, d // heads))

    def forward(self, x, pos, cos, sin, mask):
        b, t, d = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        att = (q @ self.k_cache.transpose(2, 3)) / (self.hd**0.5) + mask
        y = torch.softmax(att, dim=-1) @ self.v_cache
        x = x + self.o(y.transpose(1, 2).reshape(b, t, d))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class TinyLlama(nn.Module):
    """A Llama-shaped decoder step: embedding, RMSNorm, RoPE, SwiGLU, a KV cache per layer."""

    def __init__(self, vocab=256, d=64, heads=4, hidden=128, layers=2, max_len=16):
        super().__init__()
        self.max_len, self.hd = max_len, d // heads
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(DecoderLayer(d, heads, hidden, max_len) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd // 2).float() / (self.hd // 2)))
        ang = torch.arange(max_len).float()[:, None] * inv[None, :]
        self.register_buffer("cos_table", torch.cos(ang), persistent=False)
        self.register_buffer("sin_table", torch.sin(ang), persistent=False)

    def forward(self, tokens, pos):
        x = self.embed(tokens)
        cos, sin = self.cos_table[pos], self.sin_table[pos]
        steps = torch.arange(self.max_len)
        mask = torch.where(steps[None, :] <= pos[:, None], 0.0, float("-inf"))
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        return self.out(self.norm(x))


class TransposedTwins(nn.Module):
    """Two linear layers whose weights are the same bytes in transposed shapes, [64, 128] and
    [128, 64]: ExecuTorch names both by the sha256 of those bytes, so they are one constant, and
    XNNPACK's look-up seed (out ^ in ^ ...) is the same for both. A third layer reads the same
    bytes again, with a bias."""

    def __init__(self):
        super().__init__()
        w = torch.randn(64, 128) * 0.1
        self.a = nn.Linear(128, 64, bias=False)
        self.b = nn.Linear(64, 128, bias=False)
        self.c = nn.Linear(128, 64, bias=True)
        with torch.no_grad():
            self.a.weight.copy_(w)
            self.b.weight.copy_(w.reshape(128, 64))
            self.c.weight.copy_(w)

    def forward(self, x):
        y = torch.relu(self.a(x))
        return self.c(torch.relu(self.b(y)))


class ZeroInitialised(nn.Module):
    """Layers whose weights are all zeros, as fresh heads and LoRA's B matrices start: B1 [64, 32]
    and B2 [32, 64] are the same 8 KiB of zeros in two shapes, and two zero heads of one shape
    differ only in their biases. Every input width is a multiple of 32, for 8da4w's groups."""

    def __init__(self):
        super().__init__()
        self.base = nn.Linear(32, 64)
        self.a1 = nn.Linear(64, 32, bias=False)
        self.b1 = nn.Linear(32, 64, bias=False)
        self.a2 = nn.Linear(64, 64, bias=False)
        self.b2 = nn.Linear(64, 32, bias=False)
        self.head1 = nn.Linear(32, 16)
        self.head2 = nn.Linear(32, 16)
        with torch.no_grad():
            for zero in (self.b1, self.b2, self.head1, self.head2):
                zero.weight.zero_()

    def forward(self, x):
        h = torch.relu(self.base(x))
        h = h + self.b1(self.a1(h))
        g = torch.relu(self.b2(self.a2(h)) + h[..., :32])
        return self.head1(g) + 2.0 * self.head2(g)


def quantize_static_int8(model, inputs):
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    # Random weights with fresh batch-norm statistics shrink activations layer after layer, until
    # the quantized output is all zero: running statistics from a few batches keep them in range.
    model.train()
    with torch.no_grad():
        for _ in range(8):
            model(*[torch.randn(4, *t.shape[1:]) for t in inputs])
    m = export(model.eval(), inputs, strict=False).module()
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    m = prepare_pt2e(m, quantizer)
    for _ in range(4):
        m(*[torch.randn_like(t) for t in inputs])
    m(*inputs)
    return convert_pt2e(m)


def mobilenet_v3_for_int8():
    """MobileNetV3-Small whose random classifier is scaled up: with the default initialisation
    its logits quantize to a single value, which would make the comparison empty."""
    import torchvision

    model = torchvision.models.mobilenet_v3_small(width_mult=0.5, num_classes=10)
    with torch.no_grad():
        model.classifier[-1].weight.mul_(30.0)
        model.classifier[0].weight.mul_(4.0)
    return model


def quantize_8da4w(model):
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerGroup

    quantize_(
        model,
        Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
    )
    return model


def quantize_8da8w(model):
    """Dynamically quantized int8 activations, per-channel int8 weights (XNNPACK's qd8 x qc8w,
    whose look-up key names no bias: the bias is packed as a scale parameter)."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, quantize_
    from torchao.quantization.granularity import PerAxis

    quantize_(
        model,
        Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0)),
    )
    return model


# ---- Methods that share mutable buffers (issue 43) ------------------------------------------


class PrefillStep(nn.Module):
    """The design's case at its smallest: `prefill(x)` computes a cache into a registered buffer;
    `step(y)` reads it at every call (as an addend, not a matmul operand: see
    `export_shared`) and counts its calls in another buffer."""

    def __init__(self, d=16):
        super().__init__()
        self.encode = nn.Linear(d, d)
        self.decode = nn.Linear(d, d)
        self.register_buffer("cache", torch.zeros(1, d))
        self.register_buffer("counter", torch.zeros(1, 1))

    def prefill(self, x):
        c = torch.tanh(self.encode(x))
        self.cache.copy_(c)
        return c

    def step(self, y):
        self.counter.add_(1.0)
        return self.decode(y + self.cache) + self.counter


class MethodOf(nn.Module):
    """One method of a module, as the `forward` torch.export exports: every method's graph then
    names the module's buffers alike (`m.cache`), which is what lets the memory planner give them
    one place in the shared arena."""

    def __init__(self, module, name):
        super().__init__()
        self.m = module
        self.name = name

    def forward(self, *args):
        return getattr(self.m, self.name)(*args)


class PrefillDecode(TinyLlama):
    """A KV-cache decoder whose prefill and decode are methods of their own, as LLM runners export
    them: both run the decoder, over several positions or one, and both read and write every
    layer's caches, which the two methods share."""

    def prefill(self, tokens, pos):
        return self.forward(tokens, pos)

    def decode(self, tokens, pos):
        return self.forward(tokens, pos)


class EncoderDecoder(nn.Module):
    """The design's encoder-decoder: `encode(x)` computes a cross-attention cache (keys and values
    of the source) into buffers; `decode(y)` attends to them at every call and keeps a running
    position of its own. Each cache is read by `decode` as a matmul operand, which it also writes
    back (unchanged): a buffer a method only reads is a constant to ExecuTorch's XNNPACK
    partitioner, frozen into that method's delegate (see `export_shared`)."""

    def __init__(self, d=32, src=6, heads=2):
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.enc = nn.Linear(d, d)
        self.k, self.v = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.q, self.o = nn.Linear(d, d, bias=False), nn.Linear(d, d)
        self.register_buffer("cross_k", torch.zeros(1, heads, src, d // heads))
        self.register_buffer("cross_v", torch.zeros(1, heads, src, d // heads))
        self.register_buffer("position", torch.zeros(1, 1))

    def encode(self, x):
        b, t, d = x.shape
        h = torch.tanh(self.enc(x))
        self.cross_k.copy_(self.k(h).view(b, t, self.heads, self.hd).transpose(1, 2))
        self.cross_v.copy_(self.v(h).view(b, t, self.heads, self.hd).transpose(1, 2))
        return h

    def decode(self, y):
        b, t, d = y.shape
        # Written back as they are: the caches stay mutable buffers of this method, inputs of its
        # delegate, rather than constants frozen into it at export.
        k = self.cross_k.clone()
        v = self.cross_v.clone()
        self.cross_k.copy_(k)
        self.cross_v.copy_(v)
        self.position.add_(1.0)
        q = self.q(y + self.position).view(b, t, self.heads, self.hd).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(2, 3)) / (self.hd**0.5), dim=-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, d))


class MatmulOperand(nn.Module):
    """`prefill(x)` computes a matrix into a buffer; `step(y)` multiplies by it. Exported as
    `step` reads it (`y @ self.w`), ExecuTorch 1.5.1's XNNPACK partitioner makes the buffer the
    static weight of a fully connected node and freezes its export-time value (zeros) into
    `step`'s delegate: both backends then return zeros, and ExecuTorch's outputs differ from eager
    by the whole range. The recipe: `step` writes the buffer back as it reads it, which keeps it a
    mutable buffer of `step` (an input, not a constant); the product then runs outside the
    delegate, on the buffer that `prefill` wrote."""

    def __init__(self, d=16):
        super().__init__()
        self.enc = nn.Linear(d, d)
        self.register_buffer("w", torch.zeros(d, d))

    def prefill(self, x):
        self.w.copy_(torch.tanh(self.enc(x)))
        return self.w + 0

    def step(self, y):
        w = self.w.clone()
        self.w.copy_(w)
        return y @ w


class InitialState(nn.Module):
    """A running sum whose start is not zero: `forward(x)` adds a layer of `x` to `acc` and keeps
    it. Exported with `acc` initialized, the program carries its initial value in its mutable
    data segment, and a runtime must start from it (zeros give other outputs from the first call
    on)."""

    def __init__(self, d=16):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.register_buffer("acc", torch.arange(d, dtype=torch.float32).reshape(1, d) * 0.5 + 1.0)

    def forward(self, x):
        y = self.lin(x) + self.acc
        self.acc.copy_(y)
        return y


class MatmulOperandFrozen(MatmulOperand):
    """`MatmulOperand` without the recipe: `step` only reads the buffer, as a matmul weight, and
    ExecuTorch's partitioner freezes its export-time zeros into `step`'s delegate. Kept as the
    negative case: its recorded outputs show ExecuTorch's own runtime returning zeros where eager
    does not, and `xnnblob inspect` / `xnnblob run` warn about it."""

    def step(self, y):
        return y @ self.w


def export_shared(out, name, model, calls, external=False, share=True, initialized=()):
    """Exports `model`'s methods (the distinct ones of `calls`: [(method, inputs)], in order)
    into one program whose mutable buffers every method shares (ExecuTorch's
    `MemoryPlanningPass(share_mutable_buffers=True)`), lowered to XNNPACK. Records the eager
    outputs of the call sequence, and ExecuTorch's own (its Python runtime shares a program's
    arenas between its methods), in NAME.calls.json (not io.json: a sequence of calls, not steps of
    one method): {"program", "data", "calls": [{"method", "inputs", "outputs_eager",
    "outputs_et"}]}. With `share` False, mutable buffers stay in each method's own memory (id 1);
    the buffers named in `initialized` keep their initial values (ExecuTorch's
    `InitializedMutableBufferPass`: in the program's mutable data segment, where they are zeros
    otherwise)."""
    import copy

    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    model = model.eval()
    eager = copy.deepcopy(model)
    methods = []
    for method, inputs in calls:
        if method not in methods:
            methods.append(method)
    first_inputs = {m: next(i for c, i in calls if c == m) for m in methods}
    with torch.no_grad():
        programs = {}
        for m in methods:
            if external:
                # Weights in NAME.ptd, as the delegate keeps them there (named data).
                unlifted = export(MethodOf(model, m), first_inputs[m], strict=False).module()
                delegate_external_constants_pass_unlifted(module=unlifted, gen_tag_fn=lambda _n: name)
                programs[m] = export(unlifted, first_inputs[m], strict=False)
            else:
                programs[m] = export(MethodOf(model, m), first_inputs[m], strict=False)
        edge = to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()])
        prog = edge.to_executorch(
            ExecutorchBackendConfig(
                memory_planning_pass=MemoryPlanningPass(share_mutable_buffers=share),
                emit_mutable_buffer_names=True,
                passes=[InitializedMutableBufferPass(list(initialized))] if initialized else [],
            )
        )
    pte = os.path.join(out, name + ".pte")
    with open(pte, "wb") as f:
        prog.write_to_file(f)
    ptds = []
    if external:
        prog.write_tensor_data_to_file(out)
        ptd = os.path.join(out, name + ".ptd")
        if os.path.exists(ptd):
            ptds.append(ptd)

    program = Runtime.get().load_program(pte, data_path=ptds[0] if ptds else None)
    loaded = {m: program.load_method(m) for m in methods}
    io = {"program": os.path.basename(pte), "data": [os.path.basename(p) for p in ptds], "calls": []}
    for k, (method, inputs) in enumerate(calls):
        with torch.no_grad():
            want = getattr(eager, method)(*inputs)
        want = want if isinstance(want, (tuple, list)) else (want,)
        got = loaded[method].execute(list(inputs))
        io["calls"].append(
            {
                "method": method,
                "inputs": [tensor_entry(out, name, f"c{k}.in{i}", t) for i, t in enumerate(inputs)],
                "outputs_eager": [
                    tensor_entry(out, name, f"c{k}.out_eager{j}", o) for j, o in enumerate(want)
                ],
                "outputs_et": [
                    tensor_entry(out, name, f"c{k}.out_et{j}", o) for j, o in enumerate(got)
                ],
            }
        )
    with open(os.path.join(out, name + ".calls.json"), "w") as f:
        json.dump(io, f, indent=1)
    print(f"{name}: {os.path.getsize(pte)} bytes, {len(calls)} call(s)", flush=True)


def export_bench(out, only):
    """The peer bench's real programs: a Llama-shaped 8da4w decoder (d=1024, 12 layers, a 32k
    vocabulary, about 250 MB in .pte and .ptd) decoding 16 tokens, and ResNet-18 in fp32."""
    import torchvision

    jobs = {
        "bench_llama_8da4w": lambda: (
            quantize_8da4w(
                TinyLlama(vocab=32000, d=1024, heads=16, hidden=2816, layers=12, max_len=128).eval()
            ),
            [
                (torch.tensor([[t]]), torch.tensor([p]))
                for p, t in enumerate([1, 450, 4996, 17354, 1701, 29916, 432, 17204,
                                       975, 278, 17366, 11203, 29889, 13, 450, 338])
            ],
        ),
        "bench_resnet18_fp32": lambda: (
            torchvision.models.resnet18(num_classes=1000),
            [(torch.randn(1, 3, 224, 224),)],
        ),
        # Llama-3.2-1B's shape (d=2048, 16 layers, FFN 8192, 32 heads), a 32k vocabulary:
        # the scale of the app ExecuTorch's packed cache was made for. Not run by default
        # (about 1 GB of files and several minutes): `--only bench_llama1b_8da4w`.
        "bench_llama1b_8da4w": lambda: (
            quantize_8da4w(
                TinyLlama(vocab=32000, d=2048, heads=32, hidden=8192, layers=16, max_len=64).eval()
            ),
            [
                (torch.tensor([[t]]), torch.tensor([p]))
                for p, t in enumerate([1, 450, 4996, 17354, 1701, 29916, 432, 17204])
            ],
        ),
    }
    for name, make in jobs.items():
        if (only and name not in only) or (not only and name == "bench_llama1b_8da4w"):
            continue
        model, steps = make()
        export_one(out, name, model, steps[0], steps)
    # The d=1024 decoder as an LLM runner exports it for a prompt: prefill (16 tokens) and decode
    # (one token) as methods of their own sharing the KV caches (issue 43); the peer bench times
    # the prefill as the first execute and the decodes after it.
    name = "bench_llama_prefill_decode"
    if not only or name in only:
        prompt = [1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889, 13, 450, 338]
        following = [263, 1243, 310, 278, 3186, 29889, 13, 1576]
        calls = [("prefill", (torch.tensor([prompt]), torch.arange(len(prompt))))] + [
            ("decode", (torch.tensor([[t]]), torch.tensor([len(prompt) + k])))
            for k, t in enumerate(following)
        ]
        model = quantize_8da4w(
            PrefillDecode(vocab=32000, d=1024, heads=16, hidden=2816, layers=12, max_len=128).eval()
        )
        export_shared(out, name, model, calls)
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="", help="comma-separated names")
    parser.add_argument(
        "--bench", action="store_true", help="the peer bench's full-size programs instead"
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = {n for n in args.only.split(",") if n}
    torch.manual_seed(0)
    r = lambda *s: torch.randn(*s) * 1.5  # noqa: E731
    if args.bench:
        return export_bench(args.out, only)

    jobs = {
        "op_unary_fp32": lambda: (Unary(), (r(2, 3, 5, 8),)),
        "op_unary_fp16": lambda: (Unary().half(), (r(2, 3, 5, 8).half(),)),
        "op_binary_fp32": lambda: (Binary(4), (r(2, 16), r(2, 16), r(1, 4, 3, 3))),
        "op_binary_fp16": lambda: (Binary(4).half(), (r(2, 16).half(), r(2, 16).half(), r(1, 4, 3, 3).half())),
        "op_pooling_fp32": lambda: (Pooling(), (r(1, 4, 9, 9),)),
        "op_argmax_fp32": lambda: (ArgMax(), (r(1, 4, 6, 8),)),
        "op_deconv_fp32": lambda: (Deconv(), (r(1, 4, 5, 5),)),
        "op_pad_resize_fp32": lambda: (PadResize(), (r(1, 3, 6, 7),)),
        "op_concat_fp32": lambda: (Concat(), tuple(r(1, 2, 3, 4) for _ in range(5))),
        "op_shapes_fp32": lambda: (Shapes(), (r(2, 4, 8),)),
        "layout_channels_last_fp32": lambda: (
            ConvChannelsLast(),
            (r(1, 3, 6, 5).to(memory_format=torch.channels_last),),
        ),
        "op_sdpa_fp32": lambda: (Attention(), (r(1, 2, 5, 8), r(1, 2, 7, 8), r(1, 2, 7, 8))),
        "arch_resnet_fp32": lambda: (tiny_resnet(), (r(1, 3, 64, 64),)),
        "arch_mobilenet_v2_fp32": lambda: (
            __import__("torchvision").models.mobilenet_v2(width_mult=0.25, num_classes=10),
            (r(1, 3, 64, 64),),
        ),
        "arch_mobilenet_v3_fp32": lambda: (
            __import__("torchvision").models.mobilenet_v3_small(width_mult=0.5, num_classes=10),
            (r(1, 3, 64, 64),),
        ),
        "arch_vit_fp32": lambda: (TinyViT(), (r(1, 3, 32, 32),)),
        "arch_unet_fp32": lambda: (TinyUNet(), (r(1, 3, 16, 16),)),
    }
    for name, make in jobs.items():
        if only and name not in only:
            continue
        try:
            model, inputs = make()
            export_one(args.out, name, model, inputs)
        except Exception as e:  # one failing export must not stop the others
            print(f"{name}: FAILED: {type(e).__name__}: {str(e)[:400]}", flush=True)

    int8 = {
        "arch_mobilenet_v2_int8": lambda: (
            __import__("torchvision").models.mobilenet_v2(width_mult=0.25, num_classes=10),
            (r(1, 3, 64, 64),),
        ),
        "arch_mobilenet_v3_int8": lambda: (mobilenet_v3_for_int8(), (r(1, 3, 64, 64),)),
        "arch_resnet_int8": lambda: (tiny_resnet(), (r(1, 3, 64, 64),)),
        "op_int8_conv_pool_add": lambda: (TinyUNet(), (r(1, 3, 16, 16),)),
    }
    for name, make in int8.items():
        if only and name not in only:
            continue
        try:
            model, inputs = make()
            export_one(args.out, name, quantize_static_int8(model, inputs), inputs)
        except Exception as e:
            print(f"{name}: FAILED: {type(e).__name__}: {str(e)[:400]}", flush=True)

    # The same bytes in several shapes, or beside several biases: what a packed weight is
    # found by must cover more than the bytes (issue 38).
    identity = {
        "id_transposed_twins_fp32": lambda: (TransposedTwins(), (r(2, 128),)),
        "id_zero_init_fp32": lambda: (ZeroInitialised(), (r(3, 32),)),
        "id_zero_init_8da4w": lambda: (quantize_8da4w(ZeroInitialised()), (r(3, 32),)),
        "id_zero_init_8da8w": lambda: (quantize_8da8w(ZeroInitialised()), (r(3, 32),)),
        "id_transposed_twins_8da4w": lambda: (quantize_8da4w(TransposedTwins()), (r(2, 128),)),
    }
    for name, make in identity.items():
        if only and name not in only:
            continue
        try:
            model, inputs = make()
            export_one(args.out, name, model, inputs)
        except Exception as e:
            print(f"{name}: FAILED: {type(e).__name__}: {str(e)[:400]}", flush=True)

    if not only or "call_unused_input_fp32" in only:
        try:
            export_unused_input(args.out, "call_unused_input_fp32", (r(2, 3), r(4), r(2, 3)))
        except Exception as e:
            print(f"call_unused_input_fp32: FAILED: {type(e).__name__}: {str(e)[:400]}", flush=True)

    # Programs whose methods share mutable buffers (issue 43): the model, its calls in order, and
    # whether its weights go to a .ptd; then, optionally, whether the buffers are shared (memory
    # id 2) and which keep their initial values. `frozen_*` is exported without the recipe that
    # keeps a buffer shared, as the negative case; `state_initial_value*` are one method whose
    # buffer starts from a value of its own, in its method's memory and in the shared memory.
    tokens = [1, 9, 42, 7, 3, 99, 12]
    shared = {
        "shared_prefill_step": lambda: (
            PrefillStep(16),
            [("prefill", (r(1, 16),))] + [("step", (r(1, 16),)) for _ in range(3)],
            True,
        ),
        "shared_prefill_decode": lambda: (
            PrefillDecode(),
            [("prefill", (torch.tensor([tokens[:4]]), torch.arange(4)))]
            + [("decode", (torch.tensor([[t]]), torch.tensor([4 + k]))) for k, t in enumerate(tokens[4:])],
            False,
        ),
        "shared_encoder_decoder": lambda: (
            EncoderDecoder(),
            [("encode", (r(1, 6, 32),))] + [("decode", (r(1, 1, 32),)) for _ in range(3)],
            False,
        ),
        "shared_matmul_operand": lambda: (
            MatmulOperand(),
            [("prefill", (r(16, 16),))] + [("step", (r(1, 16),)) for _ in range(2)],
            False,
        ),
        "state_initial_value": lambda: (
            InitialState(),
            [("forward", (r(1, 16),)) for _ in range(3)],
            False,
            False,
            ("acc",),
        ),
        "state_initial_value_shared": lambda: (
            InitialState(),
            [("forward", (r(1, 16),)) for _ in range(3)],
            False,
            True,
            ("acc",),
        ),
        "frozen_matmul_operand": lambda: (
            MatmulOperandFrozen(),
            [("prefill", (r(16, 16),))] + [("step", (r(1, 16),)) for _ in range(2)],
            False,
        ),
    }
    for name, make in shared.items():
        if only and name not in only:
            continue
        try:
            model, calls, external, *options = make()
            export_shared(args.out, name, model, calls, external, *options)
        except Exception as e:
            print(f"{name}: FAILED: {type(e).__name__}: {str(e)[:400]}", flush=True)

    if not only or "arch_llama_8da4w" in only:
        try:
            model = quantize_8da4w(TinyLlama().eval())
            tokens = torch.tensor([[7]])
            steps = [(torch.tensor([[t]]), torch.tensor([p])) for p, t in enumerate([7, 42, 3, 99])]
            export_one(args.out, "arch_llama_8da4w", model, (tokens, torch.tensor([0])), steps)
        except Exception as e:
            print(f"arch_llama_8da4w: FAILED: {type(e).__name__}: {str(e)[:400]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
