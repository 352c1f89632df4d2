"""The deployment's models (docs/operations/multi-model.md): the default one (`model`, named by
`served_model_name`), the others of the `models` setting, and the aliases requests may use.

A request names its model in `model`; the api resolves it to a model's name, and the job goes to
that model's queue (`queue_of`: None, the keys every single-model deployment has always used, for
the default model; the name for the others, conveyor/jobqueue/keys.py `Keys.for_model`). With no
`models` configured the catalog is `single`: `model` is ignored, as TGI ignores it, so a
one-model deployment answers every name it always answered. Torch-free: the api, the workers and
the launcher share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.settings import Settings


@dataclass(frozen=True, slots=True)
class ModelCatalog:
    default: str  # the default model's served name
    paths: dict[str, str] = field(default_factory=dict)  # the other models: name → path
    aliases: dict[str, str] = field(default_factory=dict)  # alias → a model's name

    @classmethod
    def from_settings(cls, settings: Settings, default: str) -> ModelCatalog:
        """The catalog of `settings`, whose default model is served as `default`. Raises ValueError
        naming the setting to fix."""
        paths = settings.extra_models
        if default in paths:
            raise ValueError(f"models: {default!r} is the default model's name (served_model_name or the "
                             "model's directory); name the other models differently")
        aliases = settings.model_alias_map
        for alias, name in aliases.items():
            if alias == default:
                raise ValueError(f"model_aliases: {alias!r} is the default model's name; pick another alias")
            if name != default and name not in paths:
                raise ValueError(f"model_aliases: {alias}={name} names no model; NAME must be {default!r} "
                                 f"or one of models ({', '.join(paths) or 'none set'})")
        return cls(default, paths, aliases)

    @property
    def single(self) -> bool:
        """One model: requests' `model` is not looked at."""
        return not self.paths

    @property
    def names(self) -> tuple[str, ...]:
        """Every configured model, the default first."""
        return (self.default, *self.paths)

    def resolve(self, requested: str | None) -> str | None:
        """The name of the model a request asks for (no `model`: the default), or None: unknown."""
        if requested is None or self.single:
            return self.default
        name = self.aliases.get(requested, requested)
        return name if name in self.names else None

    def queue_of(self, name: str) -> str | None:
        """The queue of a configured model's jobs (Keys.for_model): None for the default model."""
        return None if name == self.default else name

    @property
    def queues(self) -> tuple[str | None, ...]:
        """Every configured model's queue, the default's first."""
        return (None, *self.paths)

    def aliases_of(self, name: str) -> list[str]:
        return sorted(alias for alias, target in self.aliases.items() if target == name)
