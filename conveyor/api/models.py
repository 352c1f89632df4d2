"""The api's models (conveyor/jobqueue/models.py): which model a request asks for, and that model's
tokenizer and chat template, so the api tokenizes, templates and checks limits as its workers will.

The default model's files are read at start-up (as they always were); another model's on the first
request for it, once, then kept (a tokenizer is tens of MB: only the models asked for are loaded).
Torch-free, as the rest of the api.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from conveyor.api.errors import NotFound, Unavailable
from conveyor.api.requests.chat_template import ChatTemplate
from conveyor.api.requests.tokenizer import PromptTokenizer
from conveyor.jobqueue.models import ModelCatalog

log = logging.getLogger(__name__)


class ModelNotFound(NotFound):
    """404 in OpenAI's shape with OpenAI's code: the request names a model no one serves."""

    code = "model_not_found"


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model as the api routes to it."""

    name: str  # what answers carry in `model`
    queue: str | None  # its queue (Keys.for_model): None for the default model
    tokenizer: PromptTokenizer
    chat_template: ChatTemplate | None

    @classmethod
    def load(cls, name: str, queue: str | None, model_dir: Path) -> ServedModel:
        return cls(name, queue, PromptTokenizer(model_dir), ChatTemplate.from_model_dir(model_dir))


class ModelRoutes:
    def __init__(self, catalog: ModelCatalog, default: ServedModel) -> None:
        """`catalog`'s paths are model directories (the launcher resolved each .gguf to its
        conversion before the app starts)."""
        self.catalog = catalog
        self.default = default
        self._loaded: dict[str, ServedModel] = {default.name: default}
        self._lock = threading.Lock()  # routes may run in threads (sync dependencies)

    def route(self, requested: str | None) -> ServedModel:
        """The model a request's `model` names (none: the default), its files loaded."""
        return self._get(self.name_of(requested))

    def name_of(self, requested: str | None) -> str:
        """The name of the model `requested` names (none: the default); ModelNotFound if none is
        configured by that name or alias."""
        name = self.catalog.resolve(requested)
        if name is None:
            served = ", ".join(self.catalog.names)
            raise ModelNotFound(f"The model {requested!r} does not exist: this service serves {served} "
                                "(a model only a worker reports must be added to the api's `models` "
                                "setting)", param="model")
        return name

    def _get(self, name: str) -> ServedModel:
        loaded = self._loaded.get(name)
        if loaded is not None:
            return loaded
        with self._lock:
            if name not in self._loaded:
                path = self.catalog.paths[name]
                try:
                    self._loaded[name] = ServedModel.load(name, self.catalog.queue_of(name), Path(path))
                except (OSError, ValueError) as exc:  # a missing tokenizer.json, an unreadable template
                    log.error("cannot load model %s from %s: %s", name, path, exc)
                    raise Unavailable(f"model {name!r} cannot be loaded by the api ({exc}): fix its PATH "
                                      "in the `models` setting") from exc
                log.info("model %s loaded from %s", name, path)
        return self._loaded[name]
