"""What the model cache holds (shared by loader.py, which finds models, and gguf_convert.py, which
fills the cache): a converted directory's completion marker and converter version, and the error
a model that cannot be used raises."""

from __future__ import annotations

import os

# Part of the cache key: bump it when the conversion output changes so old caches are not reused.
CONVERT_VERSION = 1
COMPLETE_MARKER = "conveyor_source.json"  # written last, so its presence marks a complete conversion


class ModelError(ValueError):
    """A model cannot be used as given; the message says what to do about it."""


def offline() -> None:
    # Before transformers/huggingface_hub are first imported: nothing in Conveyor may download.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
