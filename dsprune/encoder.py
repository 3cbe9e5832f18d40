"""One definition of how text becomes an embedding.

Prompts, EOS, padding side, pad token, truncation, pooling, the Dense head and normalisation live in
``EncoderConfig`` and nowhere else: training, scoring, pruning and evaluation all call ``Encoder.tokenize`` and
``encoder.pool``, so a model is never trained on one tokenisation and evaluated on another.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import nn

from . import arch, formats, st_folder
from .errors import DsPruneError
from .settings import cache_dir

POOLINGS = ("mean", "last", "cls")
# Post-training quantisation schemes ``Encoder.load(quantize=...)`` knows; int8: torch's dynamic quantisation of
# every Linear layer (int8 weights, activations quantised per batch as they come), whose kernels are CPU ones.
QUANTIZE = ("int8",)


def check_quantize(quantize: str | None, device: str = "cpu", dtype: str | torch.dtype = "float32",
                   skip: Sequence[str] = ()) -> None:
    """Refuse, before any model is loaded, a scheme dsprune does not know or a device/dtype it cannot run on."""
    if quantize is None:
        if skip:
            raise DsPruneError(f"quantize_skip ({', '.join(skip)}) names layers to keep float, but nothing is "
                               "quantised: add --quantize int8")
        return
    if quantize not in QUANTIZE:
        raise DsPruneError(f"quantize must be one of {', '.join(QUANTIZE)}, not {quantize!r}")
    if torch.device(device).type != "cpu":
        raise DsPruneError(f"quantize {quantize} has CPU kernels only: use --device cpu, not {device!r}")
    if (getattr(torch, dtype) if isinstance(dtype, str) else dtype) != torch.float32:
        raise DsPruneError(f"quantize {quantize} starts from float32 weights: use --dtype float32, not {dtype}")


def quant_label(quantize: str | None, skip: Sequence[str] = ()) -> str | None:
    """How a model was quantised, as results and benches name it: the scheme, and the layers it left float."""
    if not quantize:
        return None
    return f"{quantize}-skip:{','.join(skip)}" if skip else quantize


def dtype_name(dtype: str | torch.dtype) -> str:
    """``torch.bfloat16`` or ``"bfloat16"`` as the one spelling results and benches use: ``bfloat16``."""
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def inference_fingerprint(fingerprint: str, quantize: str | None, skip: Sequence[str] = (),
                          dtype: str | torch.dtype = "float32") -> str:
    """The fingerprint a model's results and benches carry when it computes in another number format than its
    float32 weights (int8 Linear layers, or bfloat16 throughout): it scores and runs differently from the
    float32 model in the same folder, so a report must never match one's speed-up or score to the other."""
    label = quant_label(quantize, skip)
    fmt = dtype_name(dtype)
    return fingerprint + (f"+{label}" if label else "") + ("" if fmt == "float32" else f"+{fmt}")


@dataclass
class EncoderConfig:
    """How a backbone is used as an embedder (saved as ``dsprune_encoder.json`` beside the weights)."""

    pooling: str = "mean"                 # mean | last | cls
    normalize: bool = True
    query_prompt: str = ""                # prefix for queries (an instruction, "query: ", ...)
    passage_prompt: str = ""              # prefix for passages (mteb's "document")
    task_prompts: dict = field(default_factory=dict)  # task name -> query prompt, overrides query_prompt
    append_eos: bool = False              # append the EOS token after truncation (last-token pooling)
    padding_side: str = "right"
    pad_token: str | None = None          # None: keep the tokenizer's, else fall back to EOS
    max_length: int = 256
    query_max_length: int | None = None   # None: max_length
    # the other named prompts of a sentence-transformers model ("STS", "Retrieval-query", ...), kept for mteb's
    # choice by task and for the export
    prompts: dict = field(default_factory=dict)
    default_prompt_name: str | None = None
    # Dense layers after pooling, before normalisation: sentence-transformers' Dense config of each
    dense: list = field(default_factory=list)

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise DsPruneError(f"encoder.pooling must be one of {', '.join(POOLINGS)}, not {self.pooling!r}")
        if self.padding_side not in ("left", "right"):
            raise DsPruneError(f"encoder.padding_side must be 'left' or 'right', not {self.padding_side!r}")
        if self.max_length < 2:
            raise DsPruneError(f"encoder.max_length must be at least 2, not {self.max_length}")
        self.dense = st_folder.check_dense(self.dense)

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise DsPruneError(f"unknown encoder option(s): {', '.join(unknown)}")
        return cls(**d)

    def prompt(self, kind: str, task: str | None = None) -> str:
        if kind == "query":
            return self.task_prompts.get(task, self.query_prompt) if task else self.query_prompt
        if kind in ("passage", "document"):
            return self.passage_prompt
        raise DsPruneError(f"kind must be 'query' or 'passage', not {kind!r}")


def config_overrides(value, what: str = "encoder") -> dict:
    """``--encoder`` options (a JSON string or a mapping) checked against EncoderConfig's fields, so a typo is an
    error before a model loads rather than a setting silently ignored."""
    import dataclasses

    from .formats import json_object

    over = value if isinstance(value, dict) else (json_object(value, f"{what} ({value!r})") if value else {})
    names = {f.name for f in dataclasses.fields(EncoderConfig)}
    unknown = sorted(set(over) - names)
    if unknown:
        raise DsPruneError(f"{what}: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    return over


def overridden_fingerprint(fingerprint: str, over: dict) -> str:
    """The fingerprint of a model scored with ``--encoder`` options: the same weights pooled or prompted otherwise
    embed differently, so their results must never be matched (or cached) as the folder's own."""
    if not over:
        return fingerprint
    import hashlib
    import json
    return f"{fingerprint}+encoder:{hashlib.sha1(json.dumps(over, sort_keys=True).encode()).hexdigest()[:8]}"


def pool(hidden: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """Pool token states over the real (non-pad) tokens; works for left and right padding."""
    mask = mask.to(hidden.dtype)
    if how == "mean":
        return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp_min(1.0)
    if how == "last":
        pos = torch.arange(mask.shape[1], device=mask.device)
        last = (pos * mask.long()).argmax(1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    if how == "cls":
        first = mask.long().argmax(1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), first]
    raise DsPruneError(f"unknown pooling {how!r}")


class Encoder(nn.Module):
    """A Hugging Face backbone, its Dense head and the ``EncoderConfig`` that says how to embed with them.

    ``head`` holds the Dense layers ``config.dense`` describes (freshly initialised when not given); being a
    submodule, it trains and saves with the backbone.
    """

    def __init__(self, model: nn.Module, tokenizer, config: EncoderConfig | None = None,
                 head: nn.ModuleList | None = None):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EncoderConfig()
        self.head = st_folder.build_head(self.config.dense) if head is None else head
        if len(self.head) != len(self.config.dense):
            raise DsPruneError(f"the head has {len(self.head)} Dense layer(s), encoder.dense {len(self.config.dense)}")
        self.train(model.training)  # an nn.Module starts in training mode; follow the backbone instead
        self.quantized: str | None = None
        self._setup_tokenizer()

    # ---- structure ---------------------------------------------------------------------------------
    @property
    def backbone(self) -> nn.Module:
        """The plain HF model (inside a dsprune export, its wrapped original architecture)."""
        return getattr(self.model, "backbone", self.model)

    @property
    def family(self) -> str:
        return arch.family_of(self.backbone.config)

    @property
    def arch(self) -> arch.Family:
        """Where this model's family keeps its parts (``dsprune.arch``)."""
        return arch.get(self.family)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def number_format(self) -> str:
        """What the forward computes in: the quantisation label when quantised, else the weights' dtype
        (``float32``, ``bfloat16``); a speed-up between two formats is not bounded by their FLOP ratio."""
        return self.quantized or dtype_name(next(self.model.parameters()).dtype)

    def configure(self, **over) -> "Encoder":
        """This encoder with ``over`` (EncoderConfig fields) over its own config; the tokenizer's padding side
        and EOS follow, since they depend on the pooling."""
        if over:
            self.config = EncoderConfig.from_dict({**dataclasses.asdict(self.config), **over})
            self._setup_tokenizer()
        return self

    def _setup_tokenizer(self) -> None:
        tok = self.tokenizer
        tok.padding_side = self.config.padding_side
        if self.config.pad_token is not None:
            tok.pad_token = self.config.pad_token
        elif tok.pad_token is None:
            if tok.eos_token is None:
                raise DsPruneError("tokenizer has neither a pad nor an EOS token: set encoder.pad_token")
            tok.pad_token = tok.eos_token
        if self.config.append_eos and tok.eos_token_id is None:
            raise DsPruneError("encoder.append_eos is set but the tokenizer has no EOS token")

    # ---- text -> tensors ---------------------------------------------------------------------------
    def token_ids(self, texts: Sequence[str], kind: str = "passage", task: str | None = None,
                  max_length: int | None = None) -> list[list[int]]:
        """Prompt, truncation and EOS, no padding: the ids ``tokenize`` pads and ``encode`` sorts by length."""
        cfg = self.config
        if max_length is None:
            max_length = (cfg.query_max_length or cfg.max_length) if kind == "query" else cfg.max_length
        prompt = cfg.prompt(kind, task)
        texts = [prompt + t for t in texts]
        room = max_length - (1 if cfg.append_eos else 0)
        ids = self.tokenizer(texts, truncation=True, max_length=room, padding=False,
                             return_attention_mask=False)["input_ids"]
        if cfg.append_eos:
            eos = self.tokenizer.eos_token_id
            ids = [x if (x and x[-1] == eos) else x + [eos] for x in ids]
        return ids

    def pad(self, ids: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """Pad token ids to the longest of them, on the configured side."""
        batch = self.tokenizer.pad({"input_ids": list(ids)}, padding=True, return_tensors="pt",
                                   return_attention_mask=True)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    def tokenize(self, texts: Sequence[str], kind: str = "passage", task: str | None = None,
                 max_length: int | None = None) -> dict[str, torch.Tensor]:
        """The one tokenisation: prompt, truncation, EOS, padding. Training and evaluation both call it."""
        return self.pad(self.token_ids(texts, kind, task, max_length))

    def batches(self, texts: Sequence[str], kind: str = "passage", batch_size: int = 32, task: str | None = None,
                max_length: int | None = None) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
        """``(indices into texts, padded batch)``, longest first. Texts are tokenised once and batched by token
        count: characters per token vary too much between texts (numbers, names, formulas) for a character
        sort to put equal token counts together, and every pad position costs a full token of compute."""
        ids = self.token_ids(texts, kind, task, max_length)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            yield idx, self.pad([ids[i] for i in idx])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        emb = pool(hidden, attention_mask, self.config.pooling)
        for layer in self.head:
            emb = layer(emb)
        if self.config.normalize:
            emb = nn.functional.normalize(emb.float(), dim=-1).to(emb.dtype)
        return emb

    def encode(self, texts: Sequence[str], kind: str = "passage", batch_size: int = 32,
               task: str | None = None, show_progress: bool = True,
               max_length: int | None = None) -> torch.Tensor:
        """Embed texts in batches of similar token count; returns fp32 on CPU, in the order given.

        The forward runs under ``torch.inference_mode`` (no autograd bookkeeping at all); the result is put
        together outside it, so it is an ordinary tensor that training code (a distillation teacher's targets)
        may use in a loss."""
        from tqdm.auto import tqdm

        texts = list(texts)
        if not texts:
            return torch.empty(0, self.embedding_dim)
        was_training = self.training
        self.eval()
        dev = self.device
        what = "queries" if kind == "query" else f"{kind}s"
        order, parts = [], []
        with torch.inference_mode():
            for idx, batch in tqdm(self.batches(texts, kind, batch_size, task, max_length),
                                   total=-(-len(texts) // batch_size), desc=f"encode {what}",
                                   disable=not show_progress, leave=False):
                parts.append(self(batch["input_ids"].to(dev), batch["attention_mask"].to(dev)).float().cpu())
                order += idx
        self.train(was_training)
        return torch.cat(parts)[torch.tensor(order).argsort()]

    def quantize(self, scheme: str | None, skip: Sequence[str] = ()) -> "Encoder":
        """Quantise the Linear layers of the backbone and the Dense head in place (None: leave as is), but those
        whose module name contains one of ``skip`` (e.g. ``down_proj``: dynamic int8 quantises a layer's input
        with one scale per batch, and an MLP's down projection reads the gated activations, where a few large
        values can leave little resolution for the rest).

        Inference only: quantised layers carry no gradient and no safetensors weights, so ``save`` refuses such
        an encoder; quantise at load time instead. The embedding table stays float32 (a lookup, no compute)."""
        import warnings

        from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic

        check_quantize(scheme, str(self.device), next(self.model.parameters()).dtype, skip)
        if scheme is None:
            return self
        if self.quantized:
            raise DsPruneError(f"the encoder is already quantised ({self.quantized})")
        linear = [n for n, m in self.named_modules() if type(m) is nn.Linear]
        unmatched = [s for s in skip if not any(s in n for n in linear)]
        if unmatched:
            raise DsPruneError(f"quantize_skip {', '.join(map(repr, unmatched))} matches no Linear layer; "
                               f"their names look like {', '.join(linear[:3])}")
        chosen = {n: default_dynamic_qconfig for n in linear if not any(s in n for s in skip)}
        with warnings.catch_warnings():     # torch announces the API's move to torchao: nothing a user can act on
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            quantize_dynamic(self, chosen, dtype=torch.qint8, inplace=True)
        self.quantized = quant_label(scheme, skip)
        return self

    @property
    def embedding_dim(self) -> int:
        if self.config.dense:
            return int(self.config.dense[-1]["out_features"])
        return int(self.backbone.config.hidden_size)

    # ---- disk --------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, sentence_transformers: bool = True) -> None:
        """Save weights, tokenizer and encoder config; also the sentence-transformers modules (Pooling, Dense
        weights, Normalize), prompts and max length, so the folder is again a sentence-transformers model."""
        if self.quantized:
            raise DsPruneError(f"a {self.quantized}-quantised encoder cannot be saved: save the float model and "
                               "quantise when loading it")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        formats.write_json(path / formats.ENCODER_CONFIG, dataclasses.asdict(self.config))
        if getattr(self.model.config, "model_type", None) == "dsprune":
            import shutil
            from .surgery import modeling_dsprune
            shutil.copy(modeling_dsprune.__file__, path / "modeling_dsprune.py")
        if sentence_transformers:
            st_folder.write(path, self.config, self.head, int(self.backbone.config.hidden_size))

    @classmethod
    def load(cls, path: str | os.PathLike, config: EncoderConfig | dict | None = None,
             dtype: str | torch.dtype = "float32", device: str = "cpu", gguf_file: str | None = None,
             attn_implementation: str | None = "sdpa", quantize: str | None = None,
             quantize_skip: Sequence[str] = ()) -> "Encoder":
        """Load an HF folder, a sentence-transformers folder, a dsprune export or a GGUF file; ``quantize``
        (one of ``QUANTIZE``) quantises it for inference after loading, but the Linear layers ``quantize_skip``
        names (see ``quantize``).

        The encoder config comes from, in order: the argument, ``dsprune_encoder.json``, the
        sentence-transformers files, defaults. The Dense head's weights always come from the folder's
        sentence-transformers modules, which must be ones dsprune can carry (else one error, never a drop).
        """
        from transformers import AutoTokenizer

        from .packaged import model_path
        check_quantize(quantize, device, dtype, quantize_skip)
        path = Path(model_path(str(path)))
        if str(path).endswith(".gguf"):
            path, gguf_file = path.parent, path.name
        if not path.exists():
            raise DsPruneError(f"model not found: {path}")
        if gguf_file:
            path = _gguf_to_folder(path, gguf_file)
        if not (path / "config.json").is_file():
            raise DsPruneError(f"not a model folder (no config.json): {path}")
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        if isinstance(config, dict):
            config = EncoderConfig.from_dict(config)
        config, dense_dirs = _encoder_config_from_folder(path, config)
        kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
        try:
            model = _load_model(path, dtype=dtype, **kw)
        except (ValueError, ImportError) as e:
            if "attn" not in str(e).lower() or not kw:
                raise
            model = _load_model(path, dtype=dtype)
        # the config is passed because AutoConfig cannot read a dsprune export's config.json by itself
        tok = AutoTokenizer.from_pretrained(path, config=model.config)
        arch.family_of(getattr(model, "backbone", model).config)  # refuses an unsupported family by name
        head = st_folder.build_head(config.dense)
        st_folder.load_head_weights(head, dense_dirs)
        return cls(model.to(device), tok, config, head.to(device=device, dtype=dtype)).quantize(quantize, quantize_skip)


def _load_model(path: Path, **kw) -> nn.Module:
    """A plain HF model, or a dsprune export built by dsprune's own ``DsPruneModel`` (no remote code, and
    nothing written into transformers' Auto registry)."""
    from transformers import AutoModel

    if formats.read_json(path / "config.json").get("model_type") != "dsprune":
        return AutoModel.from_pretrained(path, **kw)
    from .surgery.modeling_dsprune import DsPruneConfig, DsPruneModel
    config = DsPruneConfig.from_pretrained(path)
    if not config.layout:  # exported before the layout was written into the config
        config.layout = arch.get(arch.family_of(config)).layout
    return DsPruneModel.from_pretrained(path, config=config, **kw)


def _encoder_config_from_folder(path: Path, given: EncoderConfig | None) -> tuple[EncoderConfig, list[Path]]:
    """The encoder config (``given``, else ``dsprune_encoder.json``, else the sentence-transformers files, else
    defaults) and the folders of its Dense layers. A config without Dense layers takes the folder's: the head
    is part of the model, not a setting."""
    fields, dense_dirs = st_folder.read(path) if (path / "modules.json").is_file() else ({"dense": []}, [])
    config = given
    if config is None and (path / formats.ENCODER_CONFIG).is_file():
        config = EncoderConfig.from_dict(formats.read_json(path / formats.ENCODER_CONFIG))
    if config is None:
        config = EncoderConfig(**fields)
    if not config.dense and fields["dense"]:
        config = dataclasses.replace(config, dense=fields["dense"])
    if config.dense != fields["dense"]:
        raise DsPruneError(f"{path}: the encoder config has Dense layers {config.dense}, the folder's "
                           f"modules.json {fields['dense'] or 'none'}")
    return config, dense_dirs


def _gguf_to_folder(folder: Path, fname: str) -> Path:
    """Dequantise a GGUF once into a safetensors folder (transformers refuses to save GGUF-loaded models)."""
    from transformers import AutoModel, AutoTokenizer

    src = folder / fname
    if not src.is_file():
        raise DsPruneError(f"GGUF file not found: {src}")
    st = src.stat()
    key = hashlib.sha1(f"{src.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_dir() / "gguf" / f"{src.stem}-{key}"
    if (out / "config.json").is_file():
        return out
    with formats.exclusive(out.with_name(f".{out.name}.lock")):     # two ranks: one converts, one waits
        if (out / "config.json").is_file():
            return out
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
        loaded = AutoModel.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
        fresh = type(loaded)(loaded.config)
        fresh.load_state_dict(loaded.state_dict())
        with formats.output_dir(out, overwrite=True) as tmp:
            fresh.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
    return out
