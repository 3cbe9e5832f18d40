"""The object mteb calls: an ``Encoder`` behind mteb's encoder protocol.

Every text goes through ``Encoder.encode`` (the one tokenisation: prompts, EOS, padding, pooling), with mteb's
"document" mapped to the Encoder's "passage". The query prompt for a task comes from the Encoder config:
``task_prompts[task]`` when set; else, for a sentence-transformers model with named prompts beyond query and
document, the one mteb's own sentence-transformers wrapper would pick by task name and type ("STS",
"Retrieval-query", ...); else, when ``query_prompt`` holds ``{instruction}``, that template filled with the
task's instruction (GAPrune Appendix B, or mteb's task metadata); else ``query_prompt`` as it is — a model not
trained with instructions is never handed one. The document prompt is the named one picked the same way, else
``passage_prompt``.

mteb caches scores by model name and revision, and returned an old checkpoint's score for a new one, so the
revision here is a fingerprint of the weights on disk and evaluation runs with ``cache=None`` besides.
"""
from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..encoder import Encoder
from ..surgery.prune import count_params

INSTRUCTION = "{instruction}"


def named_prompt(config, task: str | None, task_type: str | None, kind: str) -> str | None:
    """The named prompt mteb would give a sentence-transformers model for this task and side, or None when the
    model has no named prompts besides query and document (those are the config's own prompts)."""
    if not config.prompts:
        return None
    from mteb.models.abs_encoder import get_prompt_name
    from mteb.types import PromptType

    named = {"query": config.query_prompt, "document": config.passage_prompt, **config.prompts}
    meta = SimpleNamespace(name=task, type=task_type)
    name = get_prompt_name(named, meta, PromptType.query if kind == "query" else PromptType.document)
    return named.get(name) if name else None


def query_prompt(config, task: str | None, instruction: str | None, task_type: str | None = None) -> str:
    """The query prompt for ``task`` (see the module docstring for the order)."""
    if task and task in config.task_prompts:
        return config.task_prompts[task]
    named = named_prompt(config, task, task_type, "query")
    if named is not None:
        return named
    if INSTRUCTION in config.query_prompt:
        return config.query_prompt.replace(INSTRUCTION, instruction or "")
    return config.query_prompt


def fingerprint(folder: str | Path) -> str:
    """SHA-1 over a model folder's weights (the Dense head's too), config and encoder config: one value per
    checkpoint. A GGUF file stands for the folder it lies in, as ``Encoder.load`` reads it."""
    folder = Path(folder)
    if folder.suffix == ".gguf":
        folder = folder.parent
    h = hashlib.sha1()
    names = sorted(p for p in folder.iterdir() if p.is_file() and (
        p.suffix in (".safetensors", ".bin", ".gguf") or p.name in ("config.json", "dsprune_encoder.json",
                                                                       "sentence_bert_config.json")))
    names += sorted(folder.glob("*_Dense/*.safetensors"))     # the head's weights change embeddings too
    for p in names:
        h.update(str(p.relative_to(folder)).encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


class MtebEncoder:
    """mteb's encoder protocol over an ``Encoder``; ``instructions`` maps task name -> instruction."""

    def __init__(self, enc: Encoder, name: str, revision: str, instructions: dict[str, str | None] | None = None,
                 batch_size: int = 32, show_progress: bool = True):
        from mteb.models import ModelMeta

        self.enc = enc
        self.instructions = dict(instructions or {})
        self.batch_size = batch_size
        self.show_progress = show_progress
        self._views: dict[str, Encoder] = {}
        self.mteb_model_meta = ModelMeta.create_empty(overwrites=dict(
            name=name if "/" in name else f"dsprune/{name}",
            revision=revision,
            n_parameters=count_params(enc.model),
            embed_dim=enc.embedding_dim,
            max_tokens=enc.config.max_length,
            similarity_fn_name="cosine" if enc.config.normalize else "dot",
            framework=["PyTorch"],
            open_weights=True,
            use_instructions=INSTRUCTION in enc.config.query_prompt or bool(enc.config.task_prompts),
        ))

    def _view(self, task: str, task_type: str | None = None) -> Encoder:
        """The Encoder with this task's prompts (shares the model and head; only the config differs)."""
        if task not in self._views:
            cfg = self.enc.config
            prompt = query_prompt(cfg, task, self.instructions.get(task), task_type)
            passage = named_prompt(cfg, task, task_type, "document")
            view_cfg = dataclasses.replace(cfg, task_prompts={**cfg.task_prompts, task: prompt},
                                           passage_prompt=cfg.passage_prompt if passage is None else passage)
            self._views[task] = Encoder(self.enc.model, self.enc.tokenizer, view_cfg, self.enc.head)
        return self._views[task]

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs) -> np.ndarray:
        texts: list[str] = []
        for batch in inputs:
            texts.extend(batch["text"])
        kind = "passage" if prompt_type is not None and str(getattr(prompt_type, "value", prompt_type)) == \
            "document" else "query"
        task = task_metadata.name
        view = self._view(task, task_metadata.type)
        emb = view.encode(texts, kind=kind, batch_size=kwargs.get("batch_size") or self.batch_size, task=task,
                          show_progress=self.show_progress)
        return emb.numpy()

    def similarity(self, a, b):
        from mteb.similarity_functions import cos_sim, dot_score
        return cos_sim(a, b) if self.enc.config.normalize else dot_score(a, b)

    def similarity_pairwise(self, a, b):
        from mteb.similarity_functions import pairwise_cos_sim, pairwise_dot_score
        return pairwise_cos_sim(a, b) if self.enc.config.normalize else pairwise_dot_score(a, b)
