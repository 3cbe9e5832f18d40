"""Load exported folders in a fresh Python process that never imports dsprune, as a user of transformers and
sentence-transformers would. All folders of a module go through one process: a process start costs more than
loading a tiny model, and every export test needs one."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import sys, json
from transformers import AutoModel, AutoTokenizer
from sentence_transformers import SentenceTransformer
paths, texts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = []
for path in paths:
    m = AutoModel.from_pretrained(path, trust_remote_code=True).eval()
    AutoTokenizer.from_pretrained(path)
    st = SentenceTransformer(path, trust_remote_code=True, device="cpu")
    got = {"n_params": sum(p.numel() for p in m.parameters()), "prompts": st.prompts,
           "max_seq_length": st.max_seq_length, "modules": [type(x).__name__ for x in st],
           "plain": st.encode(texts).tolist()}
    for kind in ("query", "document"):
        if kind in st.prompts:
            got[kind] = st.encode(texts, prompt_name=kind).tolist()
    half = SentenceTransformer(path, trust_remote_code=True, device="cpu", model_kwargs={"dtype": "bfloat16"})
    got["bf16_dtypes"] = sorted({str(p.dtype) for p in half.parameters()})
    got["bf16_document"] = half.encode(texts, prompt_name="document" if "document" in half.prompts else None,
                                       convert_to_tensor=True).float().tolist()
    out.append(got)
assert not any(k.startswith("dsprune") for k in sys.modules), "dsprune was imported"
print("RESULT " + json.dumps(out))
"""


def load_fresh(paths: list[Path], texts: list[str], cwd: Path) -> dict[Path, dict]:
    """path -> what the fresh process saw: parameter count, prompts, max length, module types, embeddings
    without a prompt (``plain``) and with each of the query/document prompts the folder names."""
    r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps([str(p) for p in paths]), json.dumps(texts)],
                       capture_output=True, text=True, cwd=cwd, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(zip(paths, json.loads(r.stdout.split("RESULT ")[-1].strip())))
