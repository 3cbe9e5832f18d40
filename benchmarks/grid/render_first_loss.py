"""Why the EffiR rows start training at a far lower loss than the drops they are compared with, from the rows'
own JSONs: what the comparison of a slimmed row with a drop-only row can and cannot say.

A gates-only slimming export equals its input bit for bit, and the next stage's first loss is the unslimmed
model's (tests/test_slim_launcher.py). What that stage trains, though, is the dropped model with the slimming
mask held, and the mask's neurons are the ones whose gates fell furthest while they trained on the first
``steps x batch`` training groups of the same seeded order (``train.data.Schedule`` is a function of seed and
group count only) — the training stage's first batch among them. So the slimmed row's first loss is that of a
model whose neurons were chosen by contrastive training on the task (on a tiny model the chosen mask lowers the
loss on groups the gates saw and on unseen ones alike, more than random masks of the same widths), and the row
had task signal its rival did not.
"""
from __future__ import annotations

from .rows import EFFIR_PAIRS, ROWS
from .section import groups_of, training_seed_list


def _stage(doc: dict, pred) -> dict | None:
    return next((s for s in (doc.get("config") or {}).get("stages", []) if pred(s)), None)


def slim_groups(doc: dict) -> int | None:
    """Training groups the row's gates saw: slimming steps x per-device batch x ranks."""
    s = _stage(doc, lambda s: s.get("args", {}).get("mode") == "slim")
    if s is None:
        return None
    a = s["args"]
    return int(a["max_steps"]) * int(a["per_device_batch_size"]) * int(s.get("num_gpus", 1))


def first_loss(doc: dict) -> float | None:
    """The first logged loss of the row's last training stage (the one after slimming, mask held)."""
    train = [k for k in doc.get("training") or {} if k.endswith("-train")]
    return doc["training"][train[-1]].get("first_loss") if train else None


def effir_start_lines(docs: dict) -> list[str]:
    out = []
    for effir, rival in EFFIR_PAIRS:
        d = docs.get(effir)
        if d is None or slim_groups(d) is None or first_loss(d) is None:
            continue
        st = d.get("structure") or {}
        dropped = st.get("drop_mlp") or []
        # the same first batch needs the same seed and groups; the same model, the same drops of both kinds
        same = [r for r, x in docs.items() if r != effir and r.startswith("t2-") and first_loss(x) is not None
                and (x.get("structure") or {}).get("drop_mlp") == dropped and not x.get("mask")
                and ((x.get("structure") or {}).get("drop_attn") or []) == (st.get("drop_attn") or [])
                and groups_of(x) == groups_of(d) and training_seed_list(x)[:1] == training_seed_list(d)[:1]]
        parts = [f"{ROWS[effir].label} starts training at loss {first_loss(d):.3f}"]
        if same:
            parts.append(f"{ROWS[same[0]].label}, the same dropped MLPs without the mask, at "
                         f"{first_loss(docs[same[0]]):.3f} on the same first batch (same seed and groups)")
        else:
            parts.append(f"no row trains its dropped model (MLPs {', '.join(map(str, dropped))}) without the mask")
        if rival in docs and first_loss(docs[rival]) is not None:
            parts.append(f"its rival {ROWS[rival].label} at {first_loss(docs[rival]):.3f}")
        out.append("; ".join(parts) + f"; its gates trained on the first {slim_groups(d)} groups")
    if not out:
        return []
    return [f"- **The EffiR rows' first training loss is the slimmed model's, so the EffiR pairs decide no "
            f"verdict.** {'. '.join(out)}. A gates-only slimming export is its input bit for bit and the next "
            "stage starts from exactly it (tests/test_slim_launcher.py); that stage trains the dropped model with "
            "the slimming mask held, and the mask removes the neurons whose gates fell furthest while training "
            "on the start of the same seeded order of groups, the first batch among them. The EffiR rows "
            "therefore had training signal their rivals did not (the paper's slimming is extra training too, "
            "500 full-parameter steps), and the first-loss gap is no sign of a fault. \"EffiR reproduces at a "
            "milder point\" is withdrawn: the differences above are measured, but a verdict needs the rival "
            "given the same slimming steps (or gates fitted on groups the training does not see) and a second "
            "seed."]
