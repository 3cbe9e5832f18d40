"""LoRA on an Encoder's model (plain HF or a pruned ``DsPruneModel``), merged away before export.

Adapters go on the model the Encoder runs, so a dropped or sliced model keeps its structure: the target
names (q_proj, ..., down_proj) match inside ``DsPruneModel.backbone``; dropped sub-layers simply have no
projections to adapt, and a sliced MLP gets adapters of its own (smaller) width. After ``merge`` the
Encoder holds the same module tree it had before ``attach``.
"""
from __future__ import annotations

from ..encoder import Encoder
from ..errors import DsPruneError


def attach(enc: Encoder, r: int = 32, alpha: int = 64, dropout: float = 0.0,
           targets: str | list[str] = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj") -> None:
    """Wrap ``enc.model`` with LoRA adapters; only adapter weights stay trainable."""
    from peft import LoraConfig, get_peft_model

    if is_attached(enc):
        raise DsPruneError("LoRA adapters are already attached")
    names = [t.strip() for t in targets.split(",")] if isinstance(targets, str) else list(targets)
    names = [t for t in names if t]
    present = {n.rsplit(".", 1)[-1] for n, _ in enc.model.named_modules()}
    missing = [t for t in names if t not in present]
    if missing:
        raise DsPruneError(f"lora_targets {missing} not found in the model (it has e.g. "
                           f"{', '.join(sorted(p for p in present if p.endswith('proj'))[:8]) or 'no *_proj'})")
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=names, bias="none")
    enc.model = get_peft_model(enc.model, cfg)


def is_attached(enc: Encoder) -> bool:
    from peft import PeftModel
    return isinstance(enc.model, PeftModel)


def merge(enc: Encoder) -> None:
    """Fold the adapters into the base weights and drop them: the model tree is the original one again."""
    if not is_attached(enc):
        raise DsPruneError("no LoRA adapters to merge")
    enc.model = enc.model.merge_and_unload()


def save_adapter(enc: Encoder, path) -> None:
    """The adapter alone (peft format), e.g. to re-apply or inspect it; the export is already merged."""
    if not is_attached(enc):
        raise DsPruneError("no LoRA adapters to save")
    enc.model.save_pretrained(str(path))
