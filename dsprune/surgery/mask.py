"""The one code path that applies a mask (``formats.write_mask`` layout) to a model, and holds it.

Every pruning method — GAPrune's DAI, its baselines, self-slimming's gates — ends in a mask file, and this
module is the only thing that turns a mask into a changed model:

* **unstructured** (keys = weight names relative to ``Encoder.backbone``, e.g. ``layers.3.mlp.up_proj.weight``):
  masked weights are set to zero in place. The shapes do not change, so an export stores the zeros
  (sparse-by-value; no speed-up without a sparse kernel).
* **structured** (keys ``mlp.<layer>`` -> bool[intermediate], original layer numbering): the dropped MLP
  neurons are removed with ``prune.slice_neurons`` — the model really gets smaller and faster.

During retraining an unstructured mask must stay fixed. ``MaskHolder`` re-zeroes the masked weights after
each optimizer step (plain modules, DeepSpeed ZeRO-1/2/3 engines including their fp32 master copies) and,
for PEFT LoRA, masks the adapter's delta in the forward pass so that the trained function is
``(W + BA)·M``; after ``merge_and_unload`` one more ``reapply`` puts the zeros back into the merged
weights, so the mask survives the merge.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .. import formats
from ..encoder import Encoder
from ..errors import DsPruneError
from . import modeling_dsprune as md


# ---- which weights a method may mask ---------------------------------------------------------------------

def _names(enc: Encoder) -> dict[int, str]:
    return {id(m): n for n, m in enc.backbone.named_modules()}


def mlp_weight_names(enc: Encoder) -> dict[int, tuple[str | None, str, str]]:
    """Per layer (original numbering, dropped MLPs skipped): weight names of (gate|None, up, down)."""
    names = _names(enc)
    fam = enc.arch
    out = {}
    for i, block in enumerate(fam.layers_of(enc.backbone)):
        try:
            gate, up, down = fam.mlp_projections(block)
        except AttributeError:  # MLP dropped
            continue
        out[i] = tuple(None if m is None else f"{names[id(m)]}.weight" for m in (gate, up, down))
    return out


def attention_weight_names(enc: Encoder) -> dict[int, list[str]]:
    """Per layer: weight names of every linear inside the attention sub-layer (dropped ones skipped)."""
    names = _names(enc)
    fam = enc.arch
    out = {}
    for i, block in enumerate(fam.layers_of(enc.backbone)):
        attn = md.get_module(block, fam.attn)
        lins = [m for m in attn.modules() if isinstance(m, nn.Linear)]
        if lins:
            out[i] = [f"{names[id(m)]}.weight" for m in lins]
    return out


def target_weights(enc: Encoder, attention: bool = False) -> dict[str, nn.Parameter]:
    """The weights GAPrune scores: every MLP matrix, plus attention projections if asked (ordered by layer)."""
    params = dict(enc.backbone.named_parameters())
    out: dict[str, nn.Parameter] = {}
    mlp = mlp_weight_names(enc)
    attn = attention_weight_names(enc) if attention else {}
    for layer in sorted(set(mlp) | set(attn)):
        for n in attn.get(layer, []):
            out[n] = params[n]
        for n in mlp.get(layer, ()):
            if n is not None:
                out[n] = params[n]
    if not out:
        raise DsPruneError("the model has no MLP (or attention) weights left to prune")
    return out


# ---- apply once ----------------------------------------------------------------------------------------

def check_unstructured(enc: Encoder, tensors: dict[str, torch.Tensor], where: str = "mask") -> dict[str, nn.Parameter]:
    params = dict(enc.backbone.named_parameters())
    out = {}
    for name, m in tensors.items():
        if name not in params:
            raise DsPruneError(f"{where}: weight {name!r} is not in this model (expected names like "
                               f"{next(iter(target_weights(enc)))!r})")
        if tuple(m.shape) != tuple(params[name].shape):
            raise DsPruneError(f"{where}: weight {name!r} has shape {tuple(params[name].shape)}, "
                               f"mask has {tuple(m.shape)}")
        out[name] = params[name]
    return out


def mask_counts(tensors: dict[str, torch.Tensor]) -> tuple[int, int]:
    """(kept, total) entries of a mask: weights for an unstructured one, neurons for a structured one."""
    return sum(int(m.sum()) for m in tensors.values()), sum(m.numel() for m in tensors.values())


def manifest_entry(kind: str, kept: int, total: int, meta: dict) -> dict:
    """What a model's manifest says of the mask it was exported with: a reader must learn that an unstructured
    mask left zeros in dense tensors (no size or speed change), whether it came from export or retraining, and
    how the mask's ranking broke ties (``meta``: the mask's own mask.json), since equal scores leave it open."""
    return {"kind": kind, "kept": kept, "total": total, "sparsity": 1 - kept / total if total else 0.0,
            "zeros_on_disk": kind == "unstructured", "method": meta.get("method"),
            **({"ties": meta["ties"]} if meta.get("ties") else {}),
            "note": "unstructured mask: pruned weights are stored as zeros in dense tensors (no size or speed change)"
            if kind == "unstructured" else "structured mask: pruned MLP neurons removed"}


def apply_mask(enc: Encoder, tensors: dict[str, torch.Tensor], kind: str, where: str = "mask",
               scale: dict[str, torch.Tensor] | None = None) -> dict:
    """Apply a mask to ``enc`` in place; returns what changed (kept/total, structure).

    ``scale`` (structured only, same keys, one value per neuron — e.g. self-slimming's gate values) is
    folded into the weights before the masked neurons are removed (``gates.fold_values``).
    """
    if kind == "unstructured":
        params = check_unstructured(enc, tensors, where)
        with torch.no_grad():
            for name, p in params.items():
                p.mul_(tensors[name].to(device=p.device, dtype=p.dtype))
        kept, total = mask_counts(tensors)
        return {"kind": kind, "kept": kept, "total": total, "zeros_on_disk": True}
    if kind == "structured":
        keep = {}
        for key, m in tensors.items():
            parts = key.split(".")
            if len(parts) != 2 or parts[0] != "mlp" or not parts[1].isdigit():
                raise DsPruneError(f"{where}: structured mask key {key!r} is not of the form 'mlp.<layer>'")
            keep[int(parts[1])] = m.to(torch.bool).flatten()
        from .prune import slice_neurons, structure
        if scale:
            from .gates import fold_values
            unknown = sorted(set(scale) - set(tensors))
            if unknown:
                raise DsPruneError(f"{where}: scale key {unknown[0]!r} has no mask entry")
            fold_values(enc, {int(k.split(".")[1]): v for k, v in scale.items()})
        slice_neurons(enc, keep)
        kept, total = mask_counts(keep)
        return {"kind": kind, "kept": kept, "total": total, "zeros_on_disk": False, "scaled": bool(scale),
                "structure": structure(enc)}
    raise DsPruneError(f"{where}: mask kind must be 'structured' or 'unstructured', not {kind!r}")


def apply_mask_dir(enc: Encoder, folder: str | Path) -> dict:
    tensors, meta = formats.read_mask(folder)
    kind = meta.get("kind")
    scale = formats.read_mask_scale(folder)
    if scale is not None and kind != "structured":
        raise DsPruneError(f"{Path(folder) / formats.MASK_SCALE}: per-neuron values need a structured mask")
    return {**apply_mask(enc, tensors, kind, where=str(Path(folder) / formats.MASK), scale=scale), "meta": meta}


# ---- hold during retraining ------------------------------------------------------------------------------

def _normalise(name: str) -> str:
    """A parameter name with wrappers stripped: PEFT's ``base_layer.``, DeepSpeed's ``module.``, etc."""
    return name.replace(".base_layer.", ".")


class MaskHolder:
    """Keep an unstructured mask in force on a module that is being trained.

    ``module`` may be the Encoder, a PEFT model, or a DeepSpeed engine around either; mask names (relative
    to the backbone) are matched to its parameters by suffix, ignoring PEFT's ``base_layer`` level.
    Call ``reapply()`` after every optimizer step (and after a LoRA merge); call ``mask_lora()`` once after
    wrapping with PEFT so the adapters' deltas are masked in the forward pass as well.
    """

    def __init__(self, module: nn.Module, tensors: dict[str, torch.Tensor]):
        self.module = module
        self.masks = {k: v.to(torch.bool) for k, v in tensors.items()}
        self.params: dict[str, nn.Parameter] = {}
        self._hooks = []
        self._resolve()

    def _resolve(self) -> None:
        found: dict[str, nn.Parameter] = {}
        for pname, p in self.module.named_parameters():
            if "lora_" in pname:
                continue
            norm = _normalise(pname)
            for key in self.masks:
                if norm == key or norm.endswith("." + key):
                    if key in found and found[key] is not p:
                        raise DsPruneError(f"mask weight {key!r} matches two parameters")
                    found[key] = p
        missing = sorted(set(self.masks) - set(found))
        if missing:
            raise DsPruneError(f"mask weight {missing[0]!r} not found in the model being trained")
        self.params = found

    @torch.no_grad()
    def reapply(self) -> None:
        """Zero every masked weight again (and any optimizer fp32 master copy DeepSpeed keeps of it)."""
        for key, p in self.params.items():
            m = self.masks[key]
            if hasattr(p, "ds_id"):  # ZeRO-3: each rank zeroes its own partition
                self._reapply_zero3(p, m)
                continue
            if hasattr(p, "_hp_mapping") and p._hp_mapping is not None:  # ZeRO-1/2 fp32 master
                from deepspeed.utils import safe_get_full_fp32_param, safe_set_full_fp32_param
                hp = safe_get_full_fp32_param(p)
                if hp is not None:
                    safe_set_full_fp32_param(p, hp * m.to(hp.device, hp.dtype).view_as(hp))
            if tuple(p.shape) != tuple(m.shape):
                raise DsPruneError(f"mask weight {key!r}: shape {tuple(m.shape)} but the model's is {tuple(p.shape)}")
            p.mul_(m.to(p.device, p.dtype))

    @staticmethod
    def _reapply_zero3(p: nn.Parameter, m: torch.Tensor) -> None:
        import torch.distributed as dist
        from deepspeed.utils import safe_get_local_fp32_param, safe_set_local_fp32_param

        local = p.ds_tensor
        part = local.numel()
        rank = dist.get_rank()
        flat = m.flatten()
        piece = torch.zeros(part, dtype=torch.bool)
        start, stop = rank * part, min(flat.numel(), (rank + 1) * part)
        if stop > start:
            piece[:stop - start] = flat[start:stop]
        local.data.mul_(piece.to(local.device, local.dtype))
        if p.requires_grad and getattr(p, "_z3_optimizer", None) is not None:
            hp = safe_get_local_fp32_param(p)
            if hp is not None:
                safe_set_local_fp32_param(p, hp * piece.to(hp.device, hp.dtype))

    def mask_lora(self) -> int:
        """Mask PEFT LoRA deltas in the forward pass: output -= x·((ΔW)·(1−M))ᵀ. Returns hooked layers.

        Exact in eval mode or with ``lora_dropout = 0`` (the correction uses the undropped input).
        """
        n = 0
        for name, mod in self.module.named_modules():
            if not (hasattr(mod, "base_layer") and hasattr(mod, "get_delta_weight") and hasattr(mod, "lora_A")):
                continue
            norm = _normalise(name + ".weight")
            key = next((k for k in self.masks if norm == k or norm.endswith("." + k)), None)
            if key is None:
                continue
            self._hooks.append(mod.register_forward_hook(self._lora_hook(self.masks[key])))
            n += 1
        return n

    @staticmethod
    def _lora_hook(mask: torch.Tensor):
        def hook(mod, args, out):
            if getattr(mod, "merged", False) or getattr(mod, "disable_adapters", False):
                return out
            x = args[0]
            delta = None
            for a in mod.active_adapters:
                if a in mod.lora_A:
                    if mod.lora_A[a].weight.numel() == 0 or mod.lora_B[a].weight.numel() == 0:
                        # ZeRO-3 released the adapter after its own forward: ΔW cannot be formed here
                        raise DsPruneError(
                            "masking LoRA deltas needs the adapter weights gathered: under ZeRO-3 keep them "
                            "persistent (stage3_param_persistence_threshold above lora_r x hidden size) or "
                            "use ZeRO-2")
                    d = mod.get_delta_weight(a)
                    delta = d if delta is None else delta + d
            if delta is None:
                return out
            dropped = delta * (~mask).to(delta.device, delta.dtype)
            return out - nn.functional.linear(x.to(dropped.dtype), dropped).to(out.dtype)
        return hook

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
