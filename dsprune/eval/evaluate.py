"""Run resolved tasks through mteb and keep what the report needs: main scores and per-query nDCG@10.

Retrieval, Classification and STS tasks all run; the main score is mteb's (nDCG@10, accuracy,
cosine Spearman), and only retrieval has per-query scores.

Data of every task is loaded (and validated) before the first text is encoded, so a bad qrels line or an
unreachable hub fails in seconds. Per-query scores come from mteb's own evaluator (pytrec_eval): the report
compares models query by query (paired bootstrap), which needs the same queries' scores for each model.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Iterator

from ..errors import DsPruneError
from .tasks import TaskSpec, build_task

PER_QUERY = ("ndcg_cut_10", "recall_100")   # pytrec_eval names -> stored as ndcg_at_10, recall_at_100
_STORE = {"ndcg_cut_10": "ndcg_at_10", "recall_100": "recall_at_100"}


def load_tasks(specs: list[TaskSpec]) -> list:
    """Build and load every task up front; a hub task offline fails here with one clear message."""
    tasks = []
    for spec in specs:
        task = build_task(spec)
        try:
            task.load_data()
        except DsPruneError:
            raise
        except Exception as e:  # datasets/hub raise many types; all mean "no data for this task"
            if spec.folder is None:
                raise DsPruneError(f"task {spec.name}: cannot load mteb task {spec.mteb_name} from the Hugging Face "
                                   f"hub ({type(e).__name__}: {str(e)[:200]}); pass {spec.name}=FOLDER for a "
                                   "local copy") from None
            raise
        tasks.append(task)
    return tasks


@contextmanager
def _per_query_scores(task) -> Iterator[dict]:
    """Keep mteb's per-query retrieval scores while ``task`` runs (mteb passes them to the task's
    ``task_specific_scores``, which this wraps for the time being and then gives back)."""
    store: dict = {}
    if not hasattr(task, "task_specific_scores"):
        yield store
        return
    own = "task_specific_scores" in vars(task)
    original = task.task_specific_scores

    def task_specific_scores(scores, qrels, results, hf_split, hf_subset):
        for pytrec_name in PER_QUERY:
            store.setdefault(hf_subset, {})[_STORE[pytrec_name]] = {
                qid: float(s[pytrec_name]) for qid, s in scores.items() if pytrec_name in s}
        return original(scores, qrels, results, hf_split=hf_split, hf_subset=hf_subset)

    task.task_specific_scores = task_specific_scores
    try:
        yield store
    finally:
        if own:
            task.task_specific_scores = original
        else:
            del task.task_specific_scores


@contextmanager
def _log_level(name: str, level: int) -> Iterator[None]:
    """Logger ``name`` at ``level`` for the time being (mteb reports every task at INFO)."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def run(model, specs: list[TaskSpec], tasks: list | None = None, batch_size: int = 32) -> dict:
    """Evaluate ``model`` (an ``MtebEncoder``) on each task; returns ``{task name: result}``."""
    import mteb

    if tasks is None:
        with _log_level("mteb", logging.WARNING):
            tasks = load_tasks(specs)
    out = {}
    for spec, task in zip(specs, tasks):
        # the encoder sees mteb's task name, which differs from dsprune's for some FinMTEB tasks
        mteb_name = task.metadata.name
        if hasattr(model, "instructions") and model.instructions.get(mteb_name) is None:
            model.instructions[mteb_name] = spec.instruction
        with _log_level("mteb", logging.WARNING), _per_query_scores(task) as store:
            result = mteb.evaluate(model, task, cache=None, encode_kwargs={"batch_size": batch_size},
                                   show_progress_bar=False, overwrite_strategy="always")
        if result.exceptions:
            raise DsPruneError(f"task {spec.name} failed in mteb: {result.exceptions[0].exception}")
        tr = result.task_results[0]
        split_scores = tr.scores.get(spec.split)
        if not split_scores:
            raise DsPruneError(f"task {spec.name}: mteb returned no scores for split {spec.split!r}")
        subset = split_scores[0]
        scores = {k: float(v) for k, v in subset.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                  and math.isfinite(float(v))}
        entry = {"type": spec.type, "source": spec.source, "split": spec.split,
                 "instruction": spec.instruction,
                 "query_prompt": model._view(mteb_name).config.task_prompts[mteb_name]
                 if hasattr(model, "_view") else None,
                 "main_score": float(subset.get("main_score", scores.get("ndcg_at_10", float("nan")))),
                 "main_metric": task.metadata.main_score,
                 "scores": scores}
        for key in ("ndcg_at_10", "recall_at_100"):
            if key in scores:
                entry[key] = scores[key]
        per_query = store.get(subset.get("hf_subset", "default"))
        if per_query:
            entry["per_query"] = per_query
            entry["num_queries"] = len(per_query["ndcg_at_10"])
        out[spec.name] = entry
    return out
