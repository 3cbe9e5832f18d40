"""dsprune: compress LLM embedding models into small, fast dense retrievers."""
__version__ = "0.1.0"

from .encoder import Encoder, EncoderConfig  # noqa: E402,F401
from .errors import DsPruneError  # noqa: E402,F401
