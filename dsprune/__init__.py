"""dsprune: compress LLM embedding models into small, fast dense retrievers."""
__version__ = "0.1.0"

from .errors import DsPruneError  # noqa: E402,F401


def __getattr__(name: str):
    """``dsprune.Encoder`` and ``dsprune.EncoderConfig`` on first use: importing them loads torch and transformers,
    which commands that never build a model (report, tune's driver, --help) should not pay for."""
    if name in ("Encoder", "EncoderConfig"):
        from . import encoder
        return getattr(encoder, name)
    raise AttributeError(f"module 'dsprune' has no attribute {name!r}")
