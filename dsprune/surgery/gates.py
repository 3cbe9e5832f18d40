"""Self-slimming neuron gates (EffiR §5.1, Eq. 7): ``W_down(ReLU(z) · Act(W_gate x) ⊙ W_up x)``.

One trainable ``z`` per intermediate neuron of every kept MLP, initialised to 1 so the gated model starts
as the original. The gate replaces the MLP's activation module (the family's ``activation`` path) by
``GatedActivation`` (``ReLU(z) · Act(·)``): for gated MLPs (every decoder family) that is exactly Eq. 7,
for BERT-style MLPs (``down(Act(up x))``) the gate sits after the activation. Wrapping the activation
(not a projection) keeps every Linear where it was, so LoRA adapters on gate/up/down see the gated signal
unchanged.

Under ZeRO-3 ``z`` is a parameter of its own small module, gathered by DeepSpeed when that module runs.
Each forward also keeps ``live`` — a differentiable copy of ``z`` made while it was gathered — so the
sparsity penalty can be computed after the forward without touching the (by then re-partitioned)
parameter, and nothing in the autograd graph holds the parameter's storage itself.

Layer indices are the original model's (dropped MLPs have no gate). Gates are removed before export,
either dropped (survivors at 1, as the paper does) or folded into the weights first (exact: into the
rows of ``up`` for gated MLPs, into the columns of ``down`` for BERT-style ones).
"""
from __future__ import annotations

import torch
from torch import nn

from ..encoder import Encoder
from ..errors import DsPruneError
from . import modeling_dsprune as md


class GatedActivation(nn.Module):
    """``ReLU(z) · act(x)`` along the last (intermediate) dimension."""

    def __init__(self, act: nn.Module, width: int, device=None, dtype=torch.float32):
        super().__init__()
        self.act = act
        self.z = nn.Parameter(torch.ones(width, device=device, dtype=dtype))
        self.live: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.z.clone()  # a plain tensor: the penalty may use it after ZeRO-3 releases the parameter
        self.live = z
        return torch.relu(z).to(x.dtype) * self.act(x)

    def extra_repr(self) -> str:
        return f"width={self.z.numel()}"


def _mlp_layers(enc: Encoder):
    """(original index, block, up Linear) of every kept MLP."""
    fam = enc.arch
    for i, block in enumerate(fam.layers_of(enc.backbone)):
        try:
            _, up, _ = fam.mlp_projections(block)
        except AttributeError:  # MLP dropped
            continue
        yield i, block, up


def gates_of(enc_or_module) -> dict[int, GatedActivation]:
    """layer -> gate module; works on an Encoder, a PEFT-wrapped one or a DeepSpeed engine around it."""
    enc = getattr(enc_or_module, "module", enc_or_module)
    if isinstance(enc, Encoder):
        out = {}
        for i, block, _ in _mlp_layers(enc):
            act = md.get_module(block, enc.arch.activation)
            if isinstance(act, GatedActivation):
                out[i] = act
        return out
    raise DsPruneError(f"expected an Encoder (or an engine around one), got {type(enc).__name__}")


def insert_gates(enc: Encoder, init: float = 1.0) -> dict[int, GatedActivation]:
    """Put a gate (z = ``init``) into every kept MLP; refuses a model that already has gates."""
    if gates_of(enc):
        raise DsPruneError("the model already has self-slimming gates")
    path = enc.arch.activation
    out = {}
    for i, block, up in _mlp_layers(enc):
        try:
            act = md.get_module(block, path)
        except AttributeError:
            raise DsPruneError(f"layer {i}: activation module {path!r} not found ({enc.family})") from None
        g = GatedActivation(act, up.out_features, device=up.weight.device)
        with torch.no_grad():
            g.z.fill_(init)
        md.set_module(block, path, g)
        out[i] = g
    if not out:
        raise DsPruneError("the model has no MLP left to gate")
    return out


def gate_parameters(enc_or_module) -> list[nn.Parameter]:
    return [g.z for _, g in sorted(gates_of(enc_or_module).items())]


def live_gates(enc_or_module) -> list[torch.Tensor]:
    """The gate values of the last forward (differentiable), in layer order."""
    gates = gates_of(enc_or_module)
    live = [g.live for _, g in sorted(gates.items())]
    if any(z is None for z in live):
        raise DsPruneError("gates have not run a forward pass yet")
    return live


@torch.no_grad()
def gate_values(enc_or_module) -> dict[int, torch.Tensor]:
    """layer -> raw z (fp32, CPU); gathers ZeRO-3 partitions (call on every rank)."""
    gates = gates_of(enc_or_module)
    params = [g.z for g in gates.values()]
    ctx = _gathered(params)
    with ctx:
        return {i: g.z.detach().float().cpu().clone() for i, g in sorted(gates.items())}


def _gathered(params):
    if any(hasattr(p, "ds_id") for p in params):
        import deepspeed
        return deepspeed.zero.GatheredParameters(params, modifier_rank=None)
    import contextlib
    return contextlib.nullcontext()


@torch.no_grad()
def set_gate_values(enc: Encoder, values: dict[int, torch.Tensor]) -> None:
    """Set z per layer (e.g. a 0/1 mask, to run the masked model the paper retrains)."""
    gates = gates_of(enc)
    for layer, v in values.items():
        if int(layer) not in gates:
            raise DsPruneError(f"no gate in MLP layer {layer}")
        g = gates[int(layer)]
        if v.numel() != g.z.numel():
            raise DsPruneError(f"gate values for layer {layer}: {v.numel()} entries, layer has {g.z.numel()}")
        g.z.copy_(v.flatten().to(g.z.device, g.z.dtype))


def remove_gates(enc: Encoder, fold: bool = False) -> dict[int, torch.Tensor]:
    """Put the plain activations back; with ``fold`` the gates' ReLU(z) is folded into the weights first.

    Without folding every gate counts as 1 (the paper's convention once the mask is fixed). Returns the
    raw z per layer.
    """
    gates = gates_of(enc)
    if not gates:
        raise DsPruneError("the model has no self-slimming gates")
    values = {i: g.z.detach().float().cpu().clone() for i, g in gates.items()}
    layers = enc.arch.layers_of(enc.backbone)
    for i, g in gates.items():
        md.set_module(layers[i], enc.arch.activation, g.act)
    if fold:
        fold_values(enc, {i: torch.relu(v) for i, v in values.items()})
    return values


@torch.no_grad()
def fold_values(enc: Encoder, scale: dict[int, torch.Tensor]) -> None:
    """Multiply each neuron's output by ``scale`` inside the weights (exact for every family).

    Gated MLPs: ``down(act(g x) ⊙ (s·up x))`` — rows of ``up`` (and its bias). BERT-style
    ``down(act(up x))``: the activation is not homogeneous, so the columns of ``down`` take ``s``.
    """
    if gates_of(enc):
        raise DsPruneError("remove the gates before folding values into the weights")
    fam = enc.arch
    layers = fam.layers_of(enc.backbone)
    for layer, s in scale.items():
        layer = int(layer)
        try:
            gate, up, down = fam.mlp_projections(layers[layer])
        except (AttributeError, IndexError):
            raise DsPruneError(f"gate values name MLP layer {layer}, which this model does not have") from None
        if s.numel() != up.out_features:
            raise DsPruneError(f"gate values for layer {layer}: {s.numel()} entries, layer has {up.out_features}")
        s = s.flatten().to(up.weight.device, up.weight.dtype)
        if gate is not None:
            up.weight.mul_(s[:, None])
            if up.bias is not None:
                up.bias.mul_(s)
        else:
            down.weight.mul_(s[None, :])


# ---- the gates on disk: gates.safetensors ("mlp.<layer>" -> raw z, fp32) in a slimming run's folder ----
GATES_FILE = "gates.safetensors"


def save_gates(path, values: dict[int, torch.Tensor], num_layers: int, family: str) -> None:
    """Write raw z per layer atomically; the metadata says how many layers the original model has."""
    from safetensors.torch import save_file

    from ..formats import atomic_file

    with atomic_file(path) as tmp:
        save_file({f"mlp.{int(i)}": v.float().contiguous().cpu() for i, v in sorted(values.items())}, str(tmp),
                  metadata={"num_layers": str(int(num_layers)), "family": family, "what": "self-slimming gates z"})


def load_gates(path) -> tuple[dict[int, torch.Tensor], dict]:
    """(layer -> raw z, metadata) from a gates file or a slimming run folder holding one."""
    from pathlib import Path

    from ..formats import open_safetensors

    path = Path(path)
    if path.is_dir():
        path = path / GATES_FILE
    if not path.is_file():
        raise DsPruneError(f"gates not found: {path} (run `launchers/train.py --mode slim` first)")
    values = {}
    with open_safetensors(path) as f:
        meta = dict(f.metadata() or {})
        for key in f.keys():
            parts = key.split(".")
            if len(parts) != 2 or parts[0] != "mlp" or not parts[1].isdigit():
                raise DsPruneError(f"{path}: key {key!r} is not of the form 'mlp.<layer>'")
            values[int(parts[1])] = f.get_tensor(key)
    if not values:
        raise DsPruneError(f"{path}: holds no gates")
    if "num_layers" in meta:
        meta["num_layers"] = int(meta["num_layers"])
    return values, meta
