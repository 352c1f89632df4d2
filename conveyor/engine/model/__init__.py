"""The model implementations: conveyor.engine.model.llama runs these Hugging Face `model_type`s.

Kept here, free of torch, so the loader can check a model directory without importing the model.
"""

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
