"""``dsprune export``: apply a mask (``dsprune prune`` or self-slimming's ``dsprune mask``) and export.

Unstructured masks are written as zeros inside dense weights (same shapes, no speed-up without sparse
kernels; the manifest says ``zeros_on_disk: true``). Structured masks remove the MLP neurons, so the export
is physically smaller and faster. The export loads with ``AutoModel.from_pretrained(dir,
trust_remote_code=True)`` and with sentence-transformers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .. import formats
from ..errors import DsPruneError
from .common import ModelArgs, load_encoder


@dataclass
class Args(ModelArgs):
    out: str = field(metadata={"help": "output folder"})
    mask: Optional[str] = field(default=None, metadata={"help": "mask folder (mask.safetensors + mask.json)"})
    overwrite: bool = False


def run(args: Args) -> int:
    from ..surgery import prune
    from ..surgery.mask import apply_mask_dir, manifest_entry

    if args.mask is None:
        raise DsPruneError("--mask is required (a folder written by `dsprune prune` or `dsprune mask`)")
    formats.check_output(args.out, args.overwrite)          # fail before loading anything
    enc = load_encoder(args)
    before = prune.count_params(enc.model)
    applied = apply_mask_dir(enc, args.mask)
    meta = applied.pop("meta")
    mask_info = manifest_entry(applied["kind"], applied["kept"], applied["total"], meta)
    prune.export(enc, args.out, args.overwrite, stage="export",
                 inputs={"model": args.model, "mask": args.mask},
                 config={k: v for k, v in vars(args).items() if k not in ("out", "overwrite")},
                 figures={"params_before": before, "params_after": prune.count_params(enc.model)},
                 params_before=before, mask=mask_info)
    print(f"exported ({mask_info['kind']} mask, sparsity {mask_info['sparsity']:.4f}, params "
          f"{before} -> {prune.count_params(enc.model)}) -> {args.out}")
    return 0
