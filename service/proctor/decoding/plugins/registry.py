"""The plugin registry: built-ins from the package plus entry points named in the configuration.

Four kinds, one entry-point group each (``GROUPS``): logits processors, stopping criteria, input
screens and output moderators.

Loaded once at start. A request names plugins; ``instantiate`` turns the names and parameters
into per-request instances or raises one ``RequestValidationError`` listing every bad call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points

from proctor.decoding.plugins.api import Kind, PluginContext, PluginParamsError, PluginSpec
from proctor.domain import FieldViolation, PluginCall, RequestValidationError

log = logging.getLogger("proctor.plugins")
GROUPS: dict[Kind, str] = {"logits_processor": "proctor.logits_processors",
                           "stopping_criterion": "proctor.stopping_criteria",
                           "input_screen": "proctor.input_screens",
                           "output_moderator": "proctor.output_moderators"}


class PluginRegistry:
    def __init__(self, specs: Iterable[PluginSpec]) -> None:
        self._specs: dict[tuple[str, str], PluginSpec] = {}
        for spec in specs:
            key = (spec.kind, spec.name)
            if key in self._specs:
                raise ValueError(f"two {spec.kind} plugins are named {spec.name!r}")
            self._specs[key] = spec

    @classmethod
    def load(cls, selection: str = "") -> PluginRegistry:
        """Built-ins, plus the entry points in ``selection`` (comma-separated names, or "*")."""
        from proctor.decoding.plugins.builtin import BUILTIN_PLUGINS

        wanted = {name.strip() for name in selection.split(",") if name.strip()}
        specs = list(BUILTIN_PLUGINS)
        found: set[str] = set()
        for kind, group in GROUPS.items():
            for point in entry_points(group=group):
                if "*" not in wanted and point.name not in wanted:
                    continue
                spec = point.load()
                if not isinstance(spec, PluginSpec) or spec.kind != kind:
                    raise ValueError(f"entry point {group}:{point.name} must be a PluginSpec of kind {kind}")
                specs.append(spec)
                found.add(point.name)
                log.info("plugin loaded: %s %s %s", kind, spec.name, spec.version)
        missing = wanted - found - {"*"}
        if missing:
            raise ValueError(f"plugins not installed (no such entry point): {', '.join(sorted(missing))}")
        return cls(specs)

    def specs(self) -> list[PluginSpec]:
        return sorted(self._specs.values(), key=lambda s: (s.kind, s.name))

    def instantiate(self, calls: tuple[PluginCall, ...], kind: Kind,
                    context: PluginContext) -> list[tuple[PluginSpec, Callable[..., object]]]:
        """Each call's plugin, created with its params; every bad name, params or plugin named at once."""
        out: list[tuple[PluginSpec, Callable[..., object]]] = []
        bad: list[FieldViolation] = []
        for call in calls:
            spec = self._specs.get((kind, call.name))
            if spec is None:
                known = ", ".join(s.name for s in self.specs() if s.kind == kind) or "none"
                bad.append(FieldViolation(f"{call.field}.name", f"unknown {kind.replace('_', ' ')} {call.name!r}; "
                                                                 f"registered: {known}"))
                continue
            try:
                instance = spec.create(dict(call.params), context)
                if not callable(instance):
                    raise TypeError(f"its factory returned {type(instance).__name__}, which cannot be called")
                out.append((spec, instance))
            except (PluginParamsError, ValueError, TypeError, KeyError) as exc:
                bad.append(FieldViolation(f"{call.field}.params", f"{call.name}: {exc}"))
        if bad:
            raise RequestValidationError(bad)
        return out
