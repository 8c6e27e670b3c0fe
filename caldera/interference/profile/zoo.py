"""Sixteen common deep-learning training workloads, small enough to step on a CPU in milliseconds.

Each is a random-initialised model, a synthetic batch of its usual input shape (scaled down) and its usual loss.
``width`` scales the models (1 = the tiny CPU size; the GPU path may use more). No weights or data are downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(slots=True)
class Workload:
    name: str
    dataset: str  # what the synthetic input stands for
    model: nn.Module
    batch: Callable[[], tuple[torch.Tensor, ...]]  # a new synthetic batch
    loss: Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor]


def _conv(cin: int, cout: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)
    )


class _Residual(nn.Module):
    def __init__(self, body: nn.Module, skip: nn.Module | None = None) -> None:
        super().__init__()
        self.body, self.skip = body, skip or nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.skip(x))


def _resnet(w: int, bottleneck: bool) -> nn.Module:
    layers: list[nn.Module] = [_conv(3, w)]
    c = w
    for i, out in enumerate((w, 2 * w, 4 * w, 8 * w)):
        stride = 1 if i == 0 else 2
        if bottleneck:
            mid = max(1, out // 4)
            body = nn.Sequential(
                nn.Conv2d(c, mid, 1, bias=False), _conv(mid, mid, stride), nn.Conv2d(mid, out, 1, bias=False)
            )
        else:
            body = nn.Sequential(_conv(c, out, stride), nn.Conv2d(out, out, 3, 1, 1, bias=False))
        layers.append(_Residual(body, nn.Conv2d(c, out, 1, stride, bias=False)))
        c = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))


def _mobilenet(w: int, se: bool) -> nn.Module:
    layers: list[nn.Module] = [_conv(3, w, 2)]
    c = w
    for out, stride in ((w, 1), (2 * w, 2), (2 * w, 1), (4 * w, 2)):
        e = c * 4
        body: list[nn.Module] = [nn.Conv2d(c, e, 1, bias=False), _conv(e, e, stride, groups=e)]
        if se:  # squeeze-and-excitation, as in EfficientNet's MBConv
            body.append(_SqueezeExcite(e))
        body.append(nn.Conv2d(e, out, 1, bias=False))
        layers.append(_Residual(nn.Sequential(*body)) if stride == 1 and c == out else nn.Sequential(*body))
        c = out
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))


class _SqueezeExcite(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.fc = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, max(1, c // 4), 1), nn.ReLU(), nn.Conv2d(max(1, c // 4), c, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc(x))


def _encoder(d: int, layers: int) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(d, 2, 2 * d, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


class _Vit(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, 8, 8)
        self.enc = _encoder(d, 2)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.patch(x).flatten(2).transpose(1, 2)).mean(1))


class _TokenModel(nn.Module):
    """BERT-style (bidirectional) or GPT-style (causal) encoder over tokens, predicting tokens."""

    def __init__(self, vocab: int, d: int, causal: bool) -> None:
        super().__init__()
        self.emb, self.enc, self.out, self.causal = nn.Embedding(vocab, d), _encoder(d, 2), nn.Linear(d, vocab), causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]) if self.causal else None
        return self.out(self.enc(self.emb(x), mask=mask, is_causal=self.causal))


class _LstmLm(nn.Module):
    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.emb, self.rnn, self.out = nn.Embedding(vocab, d), nn.LSTM(d, d, 2, batch_first=True), nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.emb(x))[0])


class _Translate(nn.Module):
    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.t = nn.Transformer(d, 2, 1, 1, 2 * d, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.out(self.t(self.emb(src), self.emb(tgt)))


class _Gan(nn.Module):
    def __init__(self, w: int) -> None:
        super().__init__()
        self.g = nn.Sequential(
            nn.ConvTranspose2d(16, 2 * w, 4, 1, 0), nn.BatchNorm2d(2 * w), nn.ReLU(),
            nn.ConvTranspose2d(2 * w, w, 4, 2, 1), nn.BatchNorm2d(w), nn.ReLU(),
            nn.ConvTranspose2d(w, 3, 4, 2, 1), nn.Tanh(),
        )  # fmt: skip
        self.d = nn.Sequential(
            nn.Conv2d(3, w, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(w, 2 * w, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Flatten(), nn.Linear(2 * w * 16, 1),
        )  # fmt: skip


class _NeuMF(nn.Module):
    def __init__(self, users: int, items: int, d: int) -> None:
        super().__init__()
        self.u, self.i = nn.Embedding(users, 2 * d), nn.Embedding(items, 2 * d)
        self.mlp = nn.Sequential(nn.Linear(2 * d, d), nn.ReLU(), nn.Linear(d, d // 2 or 1), nn.ReLU())
        self.out = nn.Linear(d + (d // 2 or 1), 1)

    def forward(self, u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        eu, ei = self.u(u), self.i(i)
        d = eu.shape[1] // 2
        gmf = eu[:, :d] * ei[:, :d]
        mlp = self.mlp(torch.cat([eu[:, d:], ei[:, d:]], 1))
        return self.out(torch.cat([gmf, mlp], 1)).squeeze(1)


class _PointNet(nn.Module):
    def __init__(self, w: int) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Conv1d(3, w, 1), nn.ReLU(), nn.Conv1d(w, 4 * w, 1), nn.ReLU())
        self.head = nn.Linear(4 * w, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.f(x).max(2).values)


class _UNet(nn.Module):
    def __init__(self, w: int) -> None:
        super().__init__()
        self.d1, self.d2 = _conv(3, w), _conv(w, 2 * w, 2)
        self.up = nn.ConvTranspose2d(2 * w, w, 2, 2)
        self.out = nn.Conv2d(2 * w, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.d1(x)
        return self.out(torch.cat([a, self.up(self.d2(a))], 1))


class _Detector(nn.Module):
    """Single-shot detection: a conv backbone, per-cell class scores and box offsets."""

    def __init__(self, w: int, classes: int = 5) -> None:
        super().__init__()
        self.backbone = nn.Sequential(_conv(3, w, 2), _conv(w, 2 * w, 2), _conv(2 * w, 2 * w, 2))
        self.cls, self.box = nn.Conv2d(2 * w, classes, 1), nn.Conv2d(2 * w, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = self.backbone(x)
        return self.cls(f), self.box(f)


class _Speech(nn.Module):
    """DeepSpeech-style: conv over spectrogram frames, a GRU, CTC over characters."""

    def __init__(self, d: int, chars: int = 29) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(40, d, 5, 2, 2), nn.ReLU())
        self.rnn, self.out = nn.GRU(d, d, batch_first=True), nn.Linear(d, chars)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.conv(x).transpose(1, 2))[0]).log_softmax(2)


def _gan_loss(m: nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    real, z = b
    fake = m.g(z)
    ones, zeros = torch.ones(real.shape[0], 1, device=real.device), torch.zeros(real.shape[0], 1, device=real.device)
    d_loss = F.binary_cross_entropy_with_logits(m.d(real), ones) + F.binary_cross_entropy_with_logits(
        m.d(fake.detach()), zeros
    )
    return d_loss + F.binary_cross_entropy_with_logits(m.d(fake), ones)


def _ctc_loss(m: nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, y = b
    logp = m(x).transpose(0, 1)
    t, n = logp.shape[0], logp.shape[1]
    in_len = torch.full((n,), t, dtype=torch.long)
    tgt_len = torch.full((n,), y.shape[1], dtype=torch.long)
    return F.ctc_loss(logp, y, in_len, tgt_len)


def _detect_loss(m: nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, cls, box = b
    c, bx = m(x)
    return F.cross_entropy(c, cls) + F.smooth_l1_loss(bx, box)


def _cls(m: nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return F.cross_entropy(m(b[0]), b[1])


def _tokens(m: nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    out = m(b[0])
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), b[1].reshape(-1))


def build(name: str, batch_size: int, device: str = "cpu", width: int = 1) -> Workload:
    """Workload ``name`` (one of :data:`WORKLOADS`) with batches of ``batch_size`` on ``device``."""
    n, w, dev = batch_size, 8 * width, device
    vocab, seq = 128, 16

    def img(size: int = 32) -> Callable[[], tuple[torch.Tensor, ...]]:
        return lambda: (torch.randn(n, 3, size, size, device=dev), torch.randint(0, 10, (n,), device=dev))

    def tok() -> tuple[torch.Tensor, ...]:
        x = torch.randint(0, vocab, (n, seq), device=dev)
        return x, x.roll(-1, 1)

    table: dict[str, tuple[str, Callable[[], nn.Module], Callable, Callable]] = {
        "resnet18": ("synthetic-cifar10", lambda: _resnet(w, False), img(), _cls),
        "resnet50": ("synthetic-imagenet", lambda: _resnet(w, True), img(), _cls),
        "vgg16": (
            "synthetic-cifar10",
            lambda: nn.Sequential(
                _conv(3, w),
                _conv(w, w),
                nn.MaxPool2d(2),
                _conv(w, 2 * w),
                _conv(2 * w, 2 * w),
                nn.MaxPool2d(2),
                _conv(2 * w, 4 * w),
                nn.MaxPool2d(2),
                nn.Flatten(),
                nn.Linear(4 * w * 16, 64),
                nn.ReLU(),
                nn.Linear(64, 10),
            ),  # fmt: skip
            img(),
            _cls,
        ),
        "mobilenet_v2": ("synthetic-imagenet", lambda: _mobilenet(w, False), img(), _cls),
        "efficientnet_b0": ("synthetic-imagenet", lambda: _mobilenet(w, True), img(), _cls),
        "vit_small": ("synthetic-imagenet", lambda: _Vit(4 * w), img(), _cls),
        "bert_base": ("synthetic-wikitext", lambda: _TokenModel(vocab, 4 * w, False), tok, _tokens),
        "gpt2_small": ("synthetic-wikitext", lambda: _TokenModel(vocab, 4 * w, True), tok, _tokens),
        "lstm_lm": ("synthetic-wikitext2", lambda: _LstmLm(vocab, 4 * w), tok, _tokens),
        "transformer_translation": (
            "synthetic-multi30k",
            lambda: _Translate(vocab, 4 * w),
            lambda: tuple(torch.randint(0, vocab, (n, seq), device=dev) for _ in range(2)),
            lambda m, b: F.cross_entropy(m(b[0], b[1]).reshape(-1, vocab), b[1].roll(-1, 1).reshape(-1)),
        ),
        "dcgan": (
            "synthetic-lsun",
            lambda: _Gan(w),
            lambda: (torch.randn(n, 3, 16, 16, device=dev), torch.randn(n, 16, 1, 1, device=dev)),
            _gan_loss,
        ),
        "neumf": (
            "synthetic-ml20m",
            lambda: _NeuMF(1000, 1000, 4 * w),
            lambda: (
                torch.randint(0, 1000, (n,), device=dev),
                torch.randint(0, 1000, (n,), device=dev),
                torch.rand(n, device=dev),
            ),
            lambda m, b: F.binary_cross_entropy_with_logits(m(b[0], b[1]), b[2]),
        ),
        "pointnet": (
            "synthetic-modelnet40",
            lambda: _PointNet(w),
            lambda: (torch.randn(n, 3, 256, device=dev), torch.randint(0, 10, (n,), device=dev)),
            _cls,
        ),
        "unet": (
            "synthetic-carvana",
            lambda: _UNet(w),
            lambda: (torch.randn(n, 3, 32, 32, device=dev), torch.randint(0, 2, (n, 32, 32), device=dev)),
            _cls,
        ),
        "detection": (
            "synthetic-coco",
            lambda: _Detector(w),
            lambda: (
                torch.randn(n, 3, 32, 32, device=dev),
                torch.randint(0, 5, (n, 4, 4), device=dev),
                torch.randn(n, 4, 4, 4, device=dev),
            ),
            _detect_loss,
        ),
        "speech": (
            "synthetic-librispeech",
            lambda: _Speech(4 * w),
            lambda: (torch.randn(n, 40, 64, device=dev), torch.randint(1, 29, (n, 8), device=dev)),
            _ctc_loss,
        ),
    }
    try:
        dataset, make, batch, loss = table[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}") from None
    return Workload(name, dataset, make().to(dev), batch, loss)


WORKLOADS = (
    "resnet18", "resnet50", "vgg16", "mobilenet_v2", "efficientnet_b0", "vit_small", "bert_base", "gpt2_small",
    "lstm_lm", "transformer_translation", "dcgan", "neumf", "pointnet", "unet", "detection", "speech",
)  # fmt: skip
