"""Contrastive losses shared by training, self-slimming and GAPrune's Fisher estimate.

They sit low in the import graph on purpose: GAPrune's parameter analysis must differentiate exactly the
loss the trainer optimises.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from every rank, keeping this rank's gradient path (no-op when not distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_gather
    return torch.cat(all_gather(x), dim=0)


def group_scores(q: torch.Tensor, p: torch.Tensor, temperature: float) -> torch.Tensor:
    """Similarity logits of every query against every passage (cosine if inputs are normalised)."""
    return q.float() @ p.float().T / temperature


def info_nce(q: torch.Tensor, p: torch.Tensor, group_size: int, temperature: float = 0.02,
             cross_rank: bool = True) -> torch.Tensor:
    """InfoNCE over in-batch and hard negatives.

    ``q``: [B, d] queries; ``p``: [B * group_size, d] passages, each query's group contiguous with its
    positive first. With ``cross_rank`` the passages (and queries) of all ranks are gathered with gradients,
    so each query also sees every other rank's passages as negatives.
    """
    if cross_rank:
        q_all, p_all = gather_with_grad(q), gather_with_grad(p)
    else:
        q_all, p_all = q, p
    logits = group_scores(q_all, p_all, temperature)
    target = torch.arange(q_all.shape[0], device=q.device) * group_size
    return F.cross_entropy(logits, target)


def kl_distill(q: torch.Tensor, p: torch.Tensor, teacher_scores: torch.Tensor, group_size: int,
               temperature: float = 0.02, teacher_temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher || student) over each query's own group (positive + hard negatives).

    ``teacher_scores``: [B, group_size] raw teacher scores (reranker logits or a teacher's similarities).
    """
    b = q.shape[0]
    pg = p.view(b, group_size, -1)
    student = torch.einsum("bd,bgd->bg", q.float(), pg.float()) / temperature
    teacher = F.softmax(teacher_scores.float() / teacher_temperature, dim=-1)
    return F.kl_div(F.log_softmax(student, dim=-1), teacher, reduction="batchmean")
