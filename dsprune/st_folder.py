"""The sentence-transformers folder: what dsprune reads from one and writes back.

dsprune carries a folder only when it can rebuild every module of it: Transformer (at the folder root),
Pooling, any number of Dense layers, and Normalize last. Anything else is refused by name, file and module,
because an embedder missing one of its modules still embeds, only wrongly.

The Dense layers keep sentence-transformers' own layout (``linear`` + activation, ``N_Dense/config.json`` and
``N_Dense/model.safetensors``), so their weights move between the two libraries under the same names.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from . import formats
from .errors import DsPruneError

KINDS = ("Transformer", "Pooling", "Dense", "Normalize")
# sentence-transformers pooling mode -> dsprune pooling
POOLING_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
# Activations rebuilt by class name; sentence-transformers records them as the class's full dotted name.
ACTIVATIONS = {cls.__name__: cls for cls in (nn.Identity, nn.Tanh, nn.ReLU, nn.GELU, nn.Sigmoid, nn.SiLU)}
DENSE_KEYS = ("in_features", "out_features", "bias", "activation_function")
EMBEDDING = "sentence_embedding"
PROMPTS_FILE = "config_sentence_transformers.json"
TRANSFORMER_FILE = "sentence_bert_config.json"


def activation_class(name: str, where: str = "dense") -> type[nn.Module]:
    """The torch activation a Dense layer names, or one error naming it and what dsprune can rebuild."""
    parts = str(name).split(".")
    if parts[:2] != ["torch", "nn"] or parts[-1] not in ACTIVATIONS:
        raise DsPruneError(f"{where}: activation {name!r} cannot be rebuilt by dsprune (it rebuilds torch.nn "
                           f"{', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[parts[-1]]


def full_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def check_dense(dense: list, where: str = "encoder.dense") -> list[dict]:
    """Dense layer specs as plain dicts with sentence-transformers' keys, chained in/out sizes."""
    out = [dense_spec(d, f"{where}[{i}]") for i, d in enumerate(dense)]
    for i in range(1, len(out)):
        if out[i - 1]["out_features"] != out[i]["in_features"]:
            raise DsPruneError(f"{where}[{i}] takes {out[i]['in_features']} features, the layer before gives "
                               f"{out[i - 1]['out_features']}")
    return out


def dense_spec(d: dict, where: str) -> dict:
    if not isinstance(d, dict) or set(d) != set(DENSE_KEYS):
        raise DsPruneError(f"{where} must have exactly the keys {', '.join(DENSE_KEYS)}, not {d!r}")
    cls = activation_class(d["activation_function"], where)
    return {"in_features": int(d["in_features"]), "out_features": int(d["out_features"]), "bias": bool(d["bias"]),
            "activation_function": full_name(cls)}


class Dense(nn.Module):
    """sentence-transformers' Dense layer: ``activation(linear(x))``, with its parameter names."""

    def __init__(self, in_features: int, out_features: int, bias: bool, activation_function: str):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = activation_class(activation_function)()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x))


def build_head(dense: list[dict]) -> nn.ModuleList:
    return nn.ModuleList(Dense(**d) for d in dense)


# ---- reading ------------------------------------------------------------------------------------------

def _kind(type_name: str) -> str | None:
    parts = str(type_name).split(".")
    return parts[-1] if parts[0] == "sentence_transformers" and parts[-1] in KINDS else None


def modules(path: Path) -> list[tuple[str, dict]]:
    """(kind, entry) of every module in ``modules.json``, checked for what dsprune can carry and its order."""
    file = path / "modules.json"
    entries = formats.read_json(file)
    out = []
    for m in entries:
        kind = _kind(m.get("type", ""))
        if kind is None:
            raise DsPruneError(f"{file}: module {m.get('name', m.get('idx'))!r} ({m.get('type')}) is not one dsprune "
                               f"can carry; it carries {', '.join(KINDS)}")
        out.append((kind, m))
    kinds = [k for k, _ in out]
    n_dense = kinds.count("Dense")
    expected = ["Transformer", "Pooling"] + ["Dense"] * n_dense + (["Normalize"] if "Normalize" in kinds else [])
    if kinds != expected:
        raise DsPruneError(f"{file}: modules {' -> '.join(kinds)}; dsprune carries Transformer -> Pooling -> "
                           "Dense ... -> Normalize in that order")
    if out[0][1].get("path", "") not in ("", "."):
        raise DsPruneError(f"{file}: module {out[0][1].get('name')!r} keeps the Transformer in "
                           f"{out[0][1]['path']!r}; dsprune reads it from the folder itself")
    return out


def _pooling(file: Path, hidden: int | None) -> str:
    p = formats.read_json(file)
    if "pooling_mode" in p:
        modes = p["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes)
    else:
        modes = [mode for key, mode in _LEGACY_POOLING.items() if p.get(key)] or ["mean"]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise DsPruneError(f"{file}: pooling {'+'.join(modes)} is not one dsprune has "
                           f"({', '.join(POOLING_MODES)})")
    if not p.get("include_prompt", True):
        raise DsPruneError(f"{file}: include_prompt false (prompt tokens left out of pooling) is not supported "
                           "by dsprune, which pools over every token")
    dim = p.get("embedding_dimension", p.get("word_embedding_dimension"))
    if hidden is not None and dim is not None and int(dim) != int(hidden):
        raise DsPruneError(f"{file}: pools {dim} features, the model's hidden size is {hidden}")
    return POOLING_MODES[modes[0]]


def _dense(folder: Path, where: str) -> dict:
    d = formats.read_json(folder / "config.json")
    for key in ("module_input_name", "module_output_name"):
        if d.get(key, EMBEDDING) != EMBEDDING:
            raise DsPruneError(f"{where}: {key} {d[key]!r}; dsprune applies Dense to the sentence embedding only")
    if d.get("use_residual"):
        raise DsPruneError(f"{where}: use_residual is not supported by dsprune")
    spec = {"in_features": d.get("in_features"), "out_features": d.get("out_features"), "bias": d.get("bias", True),
            "activation_function": d.get("activation_function", "torch.nn.modules.activation.Tanh")}
    return dense_spec(spec, where)


def _max_length(path: Path, transformer: dict) -> int:
    """sentence-transformers' max length: its own setting, else the tokenizer's capped by the positions."""
    if transformer.get("max_seq_length"):
        return int(transformer["max_seq_length"])
    limits = []
    for file, key in (("tokenizer_config.json", "model_max_length"), ("config.json", "max_position_embeddings")):
        value = formats.read_json(path / file).get(key) if (path / file).is_file() else None
        if isinstance(value, (int, float)) and value > 1:
            limits.append(int(min(value, 1 << 30)))
    return min(limits) if limits else 256


def read(path: Path) -> tuple[dict, list[Path]]:
    """The EncoderConfig fields a sentence-transformers folder defines, and its Dense layers' folders."""
    mods = modules(path)
    model_cfg = formats.read_json(path / "config.json") if (path / "config.json").is_file() else {}
    transformer = formats.read_json(path / TRANSFORMER_FILE) if (path / TRANSFORMER_FILE).is_file() else {}
    if transformer.get("do_lower_case"):
        raise DsPruneError(f"{path / TRANSFORMER_FILE}: do_lower_case is not supported by dsprune")
    pooling_entry = mods[1][1]
    fields = {"pooling": _pooling(path / pooling_entry["path"] / "config.json", model_cfg.get("hidden_size")),
              "normalize": mods[-1][0] == "Normalize", "max_length": _max_length(path, transformer)}
    dense_mods = [m for kind, m in mods if kind == "Dense"]
    dense_dirs = [path / m["path"] for m in dense_mods]
    fields["dense"], width = [], model_cfg.get("hidden_size")
    for folder, m in zip(dense_dirs, dense_mods):
        where = f"{folder / 'config.json'} (module {m['name']!r})"
        spec = _dense(folder, where)
        if width is not None and spec["in_features"] != width:
            raise DsPruneError(f"{where}: takes {spec['in_features']} features, the module before gives {width}")
        width = spec["out_features"]
        fields["dense"].append(spec)
    if (path / PROMPTS_FILE).is_file():
        st = formats.read_json(path / PROMPTS_FILE)
        prompts = {k: v or "" for k, v in (st.get("prompts") or {}).items()}
        fields["query_prompt"] = prompts.pop("query", "")
        fields["passage_prompt"] = prompts.pop("document", None) or prompts.pop("passage", "")
        fields["prompts"] = prompts
        fields["default_prompt_name"] = st.get("default_prompt_name")
    side = formats.read_json(path / "tokenizer_config.json").get("padding_side") \
        if (path / "tokenizer_config.json").is_file() else None
    if side in ("left", "right"):
        fields["padding_side"] = side
    return fields, dense_dirs


def load_head_weights(head: nn.ModuleList, folders: list[Path]) -> None:
    """Each Dense layer's weights from its folder (safetensors, or the older pytorch_model.bin)."""
    if len(folders) != len(head):
        raise DsPruneError(f"the encoder config has {len(head)} Dense layer(s), the folder {len(folders)}")
    for layer, folder in zip(head, folders):
        if (folder / "model.safetensors").is_file():
            from safetensors.torch import load_file
            file = folder / "model.safetensors"
            state = load_file(str(file))
        elif (folder / "pytorch_model.bin").is_file():
            file = folder / "pytorch_model.bin"
            state = torch.load(file, map_location="cpu", weights_only=True)
        else:
            raise DsPruneError(f"{folder}: no model.safetensors (nor pytorch_model.bin) with the Dense weights")
        try:
            layer.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise DsPruneError(f"{file}: weights do not fit the Dense layer {layer.linear}: {e}") from None


# ---- writing ------------------------------------------------------------------------------------------

def _module(idx: int, path: str, kind: str) -> dict:
    return {"idx": idx, "name": str(idx), "path": path, "type": f"sentence_transformers.models.{kind}"}


def write(path: Path, config, head: nn.ModuleList, hidden: int) -> None:
    """The sentence-transformers files for an Encoder saved at ``path`` (weights and tokenizer already there).

    Module types use the ``sentence_transformers.models`` names, which every release since 2.x resolves.
    """
    from safetensors.torch import save_file

    mode = {v: k for k, v in POOLING_MODES.items()}[config.pooling]
    mods = [_module(0, "", "Transformer"), _module(1, "1_Pooling", "Pooling")]
    pooling = {"word_embedding_dimension": hidden, **{key: m == mode for key, m in _LEGACY_POOLING.items()},
               "include_prompt": True}
    formats.write_json(path / "1_Pooling" / "config.json", pooling)
    for spec, layer in zip(config.dense, head):
        idx = len(mods)
        mods.append(_module(idx, f"{idx}_Dense", "Dense"))
        formats.write_json(path / f"{idx}_Dense" / "config.json", spec)
        state = {k: v.detach().to("cpu").contiguous() for k, v in layer.state_dict().items()}
        save_file(state, str(path / f"{idx}_Dense" / "model.safetensors"), metadata={"format": "pt"})
    if config.normalize:
        idx = len(mods)
        mods.append(_module(idx, f"{idx}_Normalize", "Normalize"))
        (path / f"{idx}_Normalize").mkdir(exist_ok=True)
    formats.write_json(path / "modules.json", mods)
    formats.write_json(path / TRANSFORMER_FILE,
                       {"max_seq_length": config.max_length, "do_lower_case": False,
                        "model_args": {"trust_remote_code": True}, "config_args": {"trust_remote_code": True}})
    formats.write_json(path / PROMPTS_FILE,
                       {"model_type": "SentenceTransformer",
                        "prompts": {"query": config.query_prompt, "document": config.passage_prompt,
                                    **config.prompts},
                        "default_prompt_name": config.default_prompt_name, "similarity_fn_name": "cosine"})
