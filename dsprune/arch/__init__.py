"""Model-family knowledge, one module per family; everything else in dsprune asks here.

Each module of this package that defines ``FAMILY`` (a ``spec.Family``) is a supported family: adding one
is a new module here plus its entry in ``dsprune.tiny.FAMILIES``, the matrix the family tests run over.
"""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import DsPruneError
from .spec import Family


def _discover() -> dict[str, Family]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        family = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FAMILY", None)
        if family is not None:
            found[family.name] = family
    return found


FAMILIES: dict[str, Family] = _discover()
_ALIASES = {alias: f.name for f in FAMILIES.values() for alias in f.aliases}


def family_of(config) -> str:
    """The family name of a Hugging Face config, or of its ``config.json`` as a dict (read before any weight
    loads, so an unsupported family is refused at once); a dsprune export's config answers for its original
    model."""
    field = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    mt = field("model_type")
    if mt == "dsprune":
        mt = (field("base") or {}).get("model_type")
    name = _ALIASES.get(mt, mt)
    if name not in FAMILIES:
        raise DsPruneError(f"unsupported model_type {mt!r}; supported: {', '.join(sorted(FAMILIES))}")
    return name


def get(name: str) -> Family:
    if name not in FAMILIES:
        raise DsPruneError(f"unknown model family {name!r}; supported: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def layer_of(name: str, family: str | None = None) -> int:
    """Layer index in a weight name such as ``layers.7.mlp.up_proj.weight`` or ``encoder.layer.7...``,
    read with ``family``'s layer-name pattern or, without one, with the first supported family's that fits."""
    for fam in [get(family)] if family else FAMILIES.values():
        m = fam.layer_pattern.search(name)
        if m:
            return int(m.group(1))
    raise DsPruneError(f"cannot tell the layer of weight {name!r}")
