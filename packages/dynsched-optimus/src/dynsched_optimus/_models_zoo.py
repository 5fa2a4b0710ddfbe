"""Parameter-block lists derived from architecture definitions (for PAA experiments).

Each function builds the network layer by layer and returns its trainable parameter
blocks (one block per weight / bias / normalisation scale / shift tensor), in definition
order, as an MXNet-style key-value store would register them.

* ``resnet50``: pre-activation ResNet-50 (v2, as in MXNet's ``symbols/resnet.py``): a
  batch-norm on the input, a 7x7 stem, 16 bottleneck units (3/4/6/3) with a batch-norm
  before each of their three convolutions, projection shortcuts on the first unit of each
  stage, a final batch-norm and the 1000-way classifier: 157 blocks, about 25.5 M.
* ``vgg16``: 13 3x3 convolutions and 3 fully connected layers with biases: 32 blocks,
  about 138 M.
* ``inception_bn``: BN-Inception (Ioffe & Szegedy 2015, the MXNet ``inception-bn``
  network): every convolution without bias followed by a batch-norm, ten inception
  modules, the classifier; about 11 M.
* ``bert_base``: a 12-layer, 768-wide transformer encoder with 30,522-token embeddings
  (BERT-base): about 110 M in 199 blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from dynsched_optimus._errors import OptimusError

__all__ = ["MODEL_ZOO", "ParameterBlock", "model_blocks"]


@attrs.frozen
class ParameterBlock:
    """One parameter tensor.

    Attributes:
        name: tensor name (layer and role).
        size: number of parameters.
    """

    name: str
    size: int


class _Net:
    def __init__(self) -> None:
        self.blocks: list[ParameterBlock] = []

    def add(self, name: str, size: int) -> None:
        self.blocks.append(ParameterBlock(name, int(size)))

    def conv(self, name: str, k: int, cin: int, cout: int, *, bias: bool = False) -> None:
        self.add(f"{name}_weight", k * k * cin * cout)
        if bias:
            self.add(f"{name}_bias", cout)

    def bn(self, name: str, ch: int) -> None:
        self.add(f"{name}_gamma", ch)
        self.add(f"{name}_beta", ch)

    def fc(self, name: str, cin: int, cout: int) -> None:
        self.add(f"{name}_weight", cin * cout)
        self.add(f"{name}_bias", cout)


def resnet50(num_classes: int = 1000) -> list[ParameterBlock]:
    """Pre-activation ResNet-50 parameter blocks (157 blocks)."""
    net = _Net()
    net.bn("bn_data", 3)
    net.conv("conv0", 7, 3, 64)
    net.bn("bn0", 64)
    units = (3, 4, 6, 3)
    filters = (256, 512, 1024, 2048)
    cin = 64
    for s, (n_units, cout) in enumerate(zip(units, filters, strict=True), start=1):
        mid = cout // 4
        for u in range(1, n_units + 1):
            name = f"stage{s}_unit{u}"
            net.bn(f"{name}_bn1", cin)
            net.conv(f"{name}_conv1", 1, cin, mid)
            net.bn(f"{name}_bn2", mid)
            net.conv(f"{name}_conv2", 3, mid, mid)
            net.bn(f"{name}_bn3", mid)
            net.conv(f"{name}_conv3", 1, mid, cout)
            if u == 1:
                net.conv(f"{name}_sc", 1, cin, cout)
            cin = cout
    net.bn("bn1", cin)
    net.fc("fc1", cin, num_classes)
    return net.blocks


def vgg16(num_classes: int = 1000) -> list[ParameterBlock]:
    """VGG-16 parameter blocks (32 blocks)."""
    net = _Net()
    cfg = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))
    cin = 3
    for g, (cout, reps) in enumerate(cfg, start=1):
        for r in range(1, reps + 1):
            net.conv(f"conv{g}_{r}", 3, cin, cout, bias=True)
            cin = cout
    net.fc("fc6", 512 * 7 * 7, 4096)
    net.fc("fc7", 4096, 4096)
    net.fc("fc8", 4096, num_classes)
    return net.blocks


def inception_bn(num_classes: int = 1000) -> list[ParameterBlock]:
    """BN-Inception parameter blocks."""
    net = _Net()

    def cbn(name: str, k: int, cin: int, cout: int) -> None:
        net.conv(name, k, cin, cout)
        net.bn(f"{name}_bn", cout)

    cbn("conv1", 7, 3, 64)
    cbn("conv2_red", 1, 64, 64)
    cbn("conv2", 3, 64, 192)
    # (1x1, 3x3 reduce, 3x3, double-3x3 reduce, double-3x3, pool projection or 0 = none)
    modules = (
        ("3a", 64, 64, 64, 64, 96, 32),
        ("3b", 64, 64, 96, 64, 96, 64),
        ("3c", 0, 128, 160, 64, 96, 0),
        ("4a", 224, 64, 96, 96, 128, 128),
        ("4b", 192, 96, 128, 96, 128, 128),
        ("4c", 160, 128, 160, 128, 160, 128),
        ("4d", 96, 128, 192, 160, 192, 128),
        ("4e", 0, 128, 192, 192, 256, 0),
        ("5a", 352, 192, 320, 160, 224, 128),
        ("5b", 352, 192, 320, 192, 224, 128),
    )
    cin = 192
    for name, c1, c3r, c3, d3r, d3, pp in modules:
        if c1:
            cbn(f"in{name}_1x1", 1, cin, c1)
        cbn(f"in{name}_3x3_red", 1, cin, c3r)
        cbn(f"in{name}_3x3", 3, c3r, c3)
        cbn(f"in{name}_d3x3_red", 1, cin, d3r)
        cbn(f"in{name}_d3x3_1", 3, d3r, d3)
        cbn(f"in{name}_d3x3_2", 3, d3, d3)
        if pp:
            cbn(f"in{name}_proj", 1, cin, pp)
        # reduction modules (no 1x1, no projection) pass the input through a max-pool
        cin = c1 + c3 + d3 + (pp if pp else cin)
    net.fc("fc1", cin, num_classes)
    return net.blocks


def bert_base(
    vocab: int = 30522, hidden: int = 768, layers: int = 12, ffn: int = 3072, positions: int = 512
) -> list[ParameterBlock]:
    """BERT-base transformer encoder parameter blocks (199 blocks)."""
    net = _Net()
    net.add("word_embeddings", vocab * hidden)
    net.add("position_embeddings", positions * hidden)
    net.add("token_type_embeddings", 2 * hidden)
    net.bn("embeddings_ln", hidden)
    for i in range(layers):
        p = f"layer{i}"
        for proj in ("query", "key", "value", "attn_out"):
            net.fc(f"{p}_{proj}", hidden, hidden)
        net.bn(f"{p}_attn_ln", hidden)
        net.fc(f"{p}_ffn_in", hidden, ffn)
        net.fc(f"{p}_ffn_out", ffn, hidden)
        net.bn(f"{p}_ffn_ln", hidden)
    net.fc("pooler", hidden, hidden)
    return net.blocks


#: name -> function returning the architecture's parameter blocks
MODEL_ZOO: dict[str, Callable[[], list[ParameterBlock]]] = {
    "resnet50": resnet50,
    "vgg16": vgg16,
    "inception_bn": inception_bn,
    "bert_base": bert_base,
}


def model_blocks(name: str) -> list[ParameterBlock]:
    """Parameter blocks of a named architecture from :data:`MODEL_ZOO`.

    Raises:
        OptimusError: unknown name (the message lists the known ones).
    """
    fn = MODEL_ZOO.get(name)
    if fn is None:
        raise OptimusError(f"unknown model {name!r}; known models: {sorted(MODEL_ZOO)}")
    return fn()
