"""Which benchmark a task name means, and local BEIR folders as mteb retrieval tasks.

The papers evaluate on the 13 BEIR datasets of EffiR Table 7, ChemTEB (in mteb) and FinMTEB (not in mteb).
Here one resolver turns what a user types into mteb tasks:

- ``NAME=FOLDER`` is a local folder. Its task type is NAME's when dsprune or mteb knows NAME (FinMTEB and
  ChemTEB tables, mteb metadata), else what the folder's layout says: a BEIR folder (``corpus.jsonl``,
  ``queries.jsonl``, ``qrels/<split>.tsv``, read by ``dsprune.data.load_beir``) becomes an
  ``AbsTaskRetrieval``; Classification and STS folders (``local_tasks``) an ``AbsTaskClassification`` or
  ``AbsTaskSTS``. When NAME is a task dsprune or mteb knows, that task's query instruction comes along.
- a bare ``NAME`` is a suite (``beir13``, ``finmteb``, ``chemteb``), a dsprune-defined task (the BEIR-13 short
  names and the shared data sets, read from the shared data folder when it holds them; FinMTEB tasks) or an
  mteb registry task (data from the Hugging Face hub, so only where the hub is reachable).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import DsPruneError
from ..settings import data_dir
from . import local_tasks

# EffiR Table 7 (Appendix A.3): dsprune short name -> mteb task name.
BEIR13 = {
    "scifact": "SciFact",
    "arguana": "ArguAna",
    "trec-covid": "TRECCOVID",
    "fiqa": "FiQA2018",
    "dbpedia": "DBPedia",
    "nfcorpus": "NFCorpus",
    "nq": "NQ",
    "hotpotqa": "HotpotQA",
    "touche2020": "Touche2020",
    "quora": "QuoraRetrieval",
    "scidocs": "SCIDOCS",
    "fever": "FEVER",
    "climate-fever": "ClimateFEVER",
}


@dataclass(frozen=True)
class FinTask:
    """One FinMTEB task of GAPrune Appendix B (Table 4): its type, instruction and mteb name if mteb has it."""

    type: str
    instruction: str
    mteb_name: str | None = None


_ANSWER = "Given a financial question, retrieve user replies that best answer the question."
_CONTEXT = "Given a financial question, retrieve the related context."
_SENTIMENT = "Classify the sentiment of a given finance text as either positive, negative, or neutral."
# GAPrune Table 4, verbatim instructions. FinMTEB itself is not in mteb; where mteb carries the same data set
# under another name it is named here, every other task needs NAME=FOLDER.
FINMTEB = {
    "FiQA2018Retrieval": FinTask("Retrieval", _ANSWER, "FiQA2018"),
    "FinanceBenchRetrieval": FinTask("Retrieval", _CONTEXT, "FinanceBenchRetrieval"),
    "HC3Retrieval": FinTask("Retrieval", "Given a financial question, retrieve relevant passages that answer "
                                         "the query.", "HC3FinanceRetrieval"),
    "Apple10KRetrieval": FinTask("Retrieval", _CONTEXT),
    "TATQARetrieval": FinTask("Retrieval", _ANSWER),
    "FinQARetrieval": FinTask("Retrieval", _ANSWER, "FinQARetrieval"),
    "USNewsRetrieval": FinTask("Retrieval", "Given a financial question, retrieve documents that can help "
                                            "answer the question."),
    "TheGoldmanEnRetrieval": FinTask("Retrieval", "Given a financial term, retrieve the related context."),
    "FinancialPhraseBankClassification": FinTask("Classification", _SENTIMENT,
                                                 "FinancialPhrasebankClassification"),
    "FinSentClassification": FinTask("Classification", _SENTIMENT),
    "FiQAClassification": FinTask("Classification", "Perform aspect based financial sentiment classification."),
    "SemEva2017Classification": FinTask("Classification", _SENTIMENT),
    "FLSClassification": FinTask("Classification", "Classify the sentence into 'not-fls', 'specific fls', or "
                                                   "'non-specific fls' class."),
    "ESGClassification": FinTask("Classification", "Classify the following sentence into one of the "
                                                   "'environmental','social', 'governance', 'non-esg' classes."),
    "FOMCClassification": FinTask("Classification", "Classify the following sentence from FOMC into 'hawkish', "
                                                    "'dovish', or 'neutral' class."),
    "FinancialFraudClassification": FinTask("Classification", "Detecting financial fraud from the given text."),
    "FinSTS": FinTask("STS", "Detecting Subtle Semantic Shifts in Financial Narratives."),
    "FINAL": FinTask("STS", "Retrieve semantically similar finance text."),
}

# GAPrune Table 5: ChemTEB tasks (all in mteb) and their instructions.
_CHEM_WIKI = {
    "WikipediaBioMetChemClassification": "biometallurgical chemistry or other chemistry fields",
    "WikipediaBiolumNeurochemClassification": "bioluminescence/neurochemistry or other chemistry fields",
    "WikipediaChemEngSpecialtiesClassification": "chemical engineering specialties or other chemistry fields",
    "WikipediaChemFieldsClassification": "different main chemistry fields",
    "WikipediaChemistryTopicsClassification": "specific chemistry topics or general chemistry",
    "WikipediaCompChemSpectroscopyClassification": "computational chemistry/spectroscopy or other chemistry fields",
    "WikipediaCryobiologySeparationClassification": "cryobiology/separation processes or other chemistry fields",
    "WikipediaCrystallographyAnalyticalClassification": "crystallography/analytical chemistry or other chemistry "
                                                        "fields",
    "WikipediaGreenhouseEnantiopureClassification": "greenhouse chemistry/enantiopure compounds or other chemistry "
                                                    "fields",
    "WikipediaIsotopesFissionClassification": "isotopes/nuclear fission or other chemistry fields",
    "WikipediaLuminescenceClassification": "luminescence chemistry or other chemistry fields",
    "WikipediaOrganicInorganicClassification": "organic chemistry or inorganic chemistry",
    "WikipediaSaltsSemiconductorsClassification": "salts/semiconductors chemistry or other chemistry fields",
    "WikipediaSolidStateColloidalClassification": "solid-state/colloidal chemistry or other chemistry fields",
    "WikipediaTheoreticalAppliedClassification": "theoretical chemistry or applied chemistry",
}
CHEMTEB = {
    "SDSEyeProtectionClassification": "Classify whether eye protection is required when handling the chemical "
                                      "based on its safety data sheet.",
    "SDSGlovesClassification": "Classify whether gloves are required when handling the chemical based on its "
                               "safety data sheet.",
    **{k: f"Classify chemistry texts into {v}." for k, v in _CHEM_WIKI.items()},
    "ChemHotpotQARetrieval": "Given a chemical question, retrieve the related context.",
    "ChemNQRetrieval": "Given a chemical question, retrieve the related context.",
}

# The shared data sets (under ``settings.data_dir``) that are not BEIR-13 names, and the benchmark task each
# stands for.
SHARED = {"scifact_small": "SciFact", "financebench": "FinanceBenchRetrieval",
          "msmarco_trecdl_subset": "MSMARCO"}

SUITES = {"beir13": list(BEIR13), "finmteb": list(FINMTEB), "chemteb": list(CHEMTEB)}


@dataclass
class TaskSpec:
    """A resolved task: where its data comes from and which query instruction it defines."""

    name: str
    type: str = "Retrieval"
    folder: Path | None = None        # local folder, else the mteb registry task ``mteb_name``
    mteb_name: str | None = None
    instruction: str | None = None
    split: str = "test"

    @property
    def source(self) -> str:
        return str(self.folder) if self.folder else f"mteb:{self.mteb_name}"


def instruction_for(name: str) -> str | None:
    """The query instruction a task defines: dsprune's (GAPrune Appendix B) first, then mteb's metadata."""
    if name in FINMTEB:
        return FINMTEB[name].instruction
    if name in CHEMTEB:
        return CHEMTEB[name]
    mteb_name = BEIR13.get(name) or SHARED.get(name) or name
    if mteb_name in FINMTEB:
        return FINMTEB[mteb_name].instruction
    meta = _mteb_metadata(mteb_name)
    if meta is None or not meta.prompt:
        return None
    return meta.prompt if isinstance(meta.prompt, str) else meta.prompt.get("query")


def type_for(name: str) -> str | None:
    """The task type a name stands for: dsprune's tables first, then mteb's metadata (None: unknown name)."""
    if name in FINMTEB:
        return FINMTEB[name].type
    if name in BEIR13 or name in SHARED:
        return "Retrieval"
    meta = _mteb_metadata(name)
    return meta.type if meta is not None else None


def _mteb_metadata(name: str):
    import mteb
    try:
        return mteb.get_task(name).metadata
    except (KeyError, ValueError):
        return None


def resolve(spec: str, split: str | None = None) -> list[TaskSpec]:
    """Turn ``NAME``, ``NAME=FOLDER`` or a suite name into task specs (validated; no data read yet)."""
    if "=" in spec:
        name, folder = spec.split("=", 1)
        if not name or not folder:
            raise DsPruneError(f"task {spec!r}: expected NAME=FOLDER")
        folder, split = Path(folder).expanduser(), split or "test"
        known = type_for(name)
        known = known if known in local_tasks.LAYOUT else None
        if not folder.is_dir():
            raise DsPruneError(f"task {name}: {'BEIR' if known in (None, 'Retrieval') else known} folder not "
                               f"found: {folder}")
        layout = local_tasks.folder_type(folder, split)
        if known and layout and layout != known:
            raise DsPruneError(f"task {name} is a {known} task, but {folder} holds a {layout} folder "
                               f"(expected {local_tasks.LAYOUT[known]})")
        type_ = known or layout
        if type_ is None:
            raise DsPruneError(f"task {name}: cannot tell the task type of {folder}; expected one of: " +
                               "; ".join(f"{t}: {lay}" for t, lay in local_tasks.LAYOUT.items()))
        return [TaskSpec(name, type=type_, folder=folder, instruction=instruction_for(name), split=split)]
    name = spec
    if name.lower() in SUITES:
        return [t for n in SUITES[name.lower()] for t in resolve(n, split)]
    if name in BEIR13 or name in SHARED:
        local = data_dir(name)
        if (local / "corpus.jsonl").is_file():
            return [TaskSpec(name, folder=local, instruction=instruction_for(name), split=split or "test")]
        if name in SHARED:
            raise DsPruneError(f"task {name}: shared data folder not found: {local} (set DSPRUNE_SHARED)")
        return [_registry(name, BEIR13[name], split)]
    if name in FINMTEB:
        ft = FINMTEB[name]
        if ft.mteb_name is None:
            raise DsPruneError(f"task {name}: FinMTEB is not in mteb and dsprune knows no download for it; "
                               f"pass {name}=FOLDER with a local copy ({local_tasks.LAYOUT[ft.type]})")
        return [_registry(name, ft.mteb_name, split, ft.instruction, ft.type)]
    if name in CHEMTEB:
        return [_registry(name, name, split, CHEMTEB[name])]
    return [_registry(name, name, split)]


def _registry(name: str, mteb_name: str, split: str | None, instruction: str | None = None,
              type_: str | None = None) -> TaskSpec:
    meta = _mteb_metadata(mteb_name)
    if meta is None:
        known = ", ".join(sorted(SUITES) + sorted(BEIR13) + sorted(SHARED))
        raise DsPruneError(f"unknown task {name!r}: not a dsprune task ({known}, the FinMTEB and ChemTEB "
                           f"names) nor an mteb task; for a local folder write {name}=FOLDER")
    if instruction is None and meta.prompt:
        instruction = meta.prompt if isinstance(meta.prompt, str) else meta.prompt.get("query")
    if split is not None and split not in meta.eval_splits:
        raise DsPruneError(f"task {name}: split {split!r} not among mteb's {meta.eval_splits}")
    return TaskSpec(name, type=type_ or meta.type, mteb_name=mteb_name, instruction=instruction,
                    split=split or meta.eval_splits[0])


# ---- mteb task objects --------------------------------------------------------------------------------

def build_task(spec: TaskSpec):
    """The mteb task object for a spec; a local folder becomes a subclass of mteb's task for its type."""
    if spec.folder is None:
        import mteb
        return mteb.get_task(spec.mteb_name, eval_splits=[spec.split])
    from mteb.abstasks.task_metadata import TaskMetadata

    base = local_tasks.task_class(spec.type)
    metadata = TaskMetadata(
        name=spec.name,
        description=f"Local {spec.type} folder {spec.folder}",
        reference=None,
        dataset={"path": str(spec.folder), "revision": "local"},
        type=spec.type,
        category=local_tasks.CATEGORY[spec.type],
        modalities=["text"],
        eval_splits=[spec.split],
        eval_langs=["eng-Latn"],
        main_score=local_tasks.MAIN_SCORE[spec.type],
        prompt={"query": spec.instruction} if spec.instruction else None,
    )
    cls = type(f"Local_{abs(hash(spec.name))}", (base,), {"metadata": metadata})
    return cls(spec)
