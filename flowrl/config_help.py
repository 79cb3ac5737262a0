"""Every config field's help text, default and rule, for ``flowrl config`` and ``docs/settings.md``.

A field's help is the ``#:`` comment block right above it in its dataclass (the convention Sphinx's
autodoc reads), so the help lives beside the field it explains and there is one source for the code,
the command and the docs. ``flowrl config CONFIG [overrides]`` prints the resolved config as YAML with
each field's help and default; ``--diff`` keeps only what differs from the defaults; ``--markdown`` prints
the settings reference (``docs/settings.md``, which a test keeps equal to it).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
from typing import Any

import yaml

from flowrl.algorithms import ALGORITHMS
from flowrl.models import BACKENDS
from flowrl.train_config import TrainConfig

_FIELD = re.compile(r"^\s+(\w+)\s*:")
#: the top-level sections of a config, in the order a config file lists them
SECTIONS = (
    "model",
    "sampler",
    "rewards",
    "reward_aggregation",
    "algorithm",
    "training",
    "data",
    "logging",
    "evaluation",
    "resume",
)


@functools.cache
def field_help(cls: type) -> dict[str, str]:
    """``{field: help}`` of the dataclass ``cls`` and its dataclass bases: the ``#:`` lines above each
    field, joined into one line (a subclass's comment wins over its base's)."""
    helps: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            helps.update(_own_help(klass))
    return helps


def _own_help(cls: type) -> dict[str, str]:
    source = inspect.getsource(cls).splitlines()
    lines = source[next(i for i, line in enumerate(source) if line.lstrip().startswith("class ")) + 1 :]
    indent = next(len(line) - len(line.lstrip()) for line in lines if line.strip())
    helps: dict[str, str] = {}
    comment: list[str] = []
    for line in lines:
        stripped, depth = line.strip(), len(line) - len(line.lstrip())
        if stripped and depth > indent:  # a continuation of the line above
            continue
        if stripped.startswith("#:"):
            comment.append(stripped[2:].strip())
            continue
        match = _FIELD.match(line)
        if match and depth == indent and comment:
            helps[match.group(1)] = " ".join(comment)
        comment = []
    return helps


def section_classes() -> dict[str, type]:
    """Every config dataclass a run can use, by where it sits: the shared sections, each algorithm's
    (``algorithm: <name>``) and each backend's (``model: <backend>``)."""
    shared = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
    classes = {
        name: _section_type(name)
        for name in shared
        if name not in ("model", "algorithm") and _section_type(name)
    }
    classes |= {f"algorithm: {name}": entry.config for name, entry in ALGORITHMS.items()}
    classes |= {f"model: {name}": backend.config_class for name, backend in BACKENDS.items()}
    return classes


def _section_type(name: str) -> type | None:
    kind = {f.name: f for f in dataclasses.fields(TrainConfig)}[name].default_factory  # type: ignore[misc]
    return kind if dataclasses.is_dataclass(kind) else None


def default_of(item: dataclasses.Field) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return None


def rule_of(item: dataclasses.Field) -> str:
    """The field's rule as text: its choices, or its bounds."""
    rules = item.metadata
    if "choices" in rules:
        return "one of " + ", ".join(str(choice) for choice in rules["choices"])
    bounds = []
    if "min" in rules:
        bounds.append(f"{'>' if rules.get('strict') else '>='} {rules['min']:g}")
    if "max" in rules:
        bounds.append(f"<= {rules['max']:g}")
    return " and ".join(bounds)


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def render_config(config: TrainConfig, diff: bool = False) -> str:
    """The resolved ``config`` as YAML: each field with its help above it and its default beside it
    when the value differs; ``diff`` keeps only the fields whose value differs from their default."""
    lines: list[str] = []
    for name in SECTIONS:
        value = getattr(config, name)
        if dataclasses.is_dataclass(value):
            body = _render_section(value, diff)
            if body or not diff:
                kind = type(value).__name__
                lines += [f"{name}:  # {kind}", *body]
        else:
            item = {f.name: f for f in dataclasses.fields(TrainConfig)}[name]
            default = default_of(item)
            if diff and value == default:
                continue
            help_text = field_help(TrainConfig).get(name)
            lines += [f"# {help_text.replace('``', '')}"] if help_text else []
            lines.append(_line(name, value, default, indent=""))
    return "\n".join(lines) + "\n"


def _render_section(section: Any, diff: bool) -> list[str]:
    helps, lines = field_help(type(section)), []
    for item in dataclasses.fields(section):
        value, default = getattr(section, item.name), default_of(item)
        if diff and value == default and item.name not in ("name", "backend"):
            continue
        if item.name in helps:
            lines.append(f"  # {helps[item.name].replace('``', '')}")
        lines.append(_line(item.name, value, default, indent="  "))
    return lines


def _line(name: str, value: Any, default: Any, indent: str) -> str:
    text = f"{indent}{name}: {_scalar(value)}"
    return text if value == default else f"{text}  # default: {_scalar(default)}"


def settings_markdown() -> str:
    """``docs/settings.md``: every field of every section, algorithm and backend with its default, rule
    and help."""
    lines = [
        "# Settings",
        "",
        "Every key of a training config, generated from the config dataclasses (their `#:` comments) by",
        "`flowrl config --markdown > docs/settings.md`; `tests/test_config_help.py` keeps this file equal to",
        "it. `flowrl config CONFIG [overrides]` prints a config resolved, with the same help beside each key.",
        "",
        "Top-level keys: "
        + ", ".join(
            f"`{item.name}`"
            for item in dataclasses.fields(TrainConfig)
            if not dataclasses.is_dataclass(default_of(item)) and item.name not in ("model", "algorithm")
        )
        + ".",
        "",
    ]
    top = field_help(TrainConfig)
    for item in dataclasses.fields(TrainConfig):
        if item.name in top and _section_type(item.name) is None and item.name not in ("model", "algorithm"):
            lines.append(f"- `{item.name}` (default `{_scalar(default_of(item))}`): {top[item.name]}")
    lines.append("")
    for where, cls in section_classes().items():
        lines += [f"## `{where}`", "", (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " "), ""]
        lines += ["| key | default | allowed | what it does |", "|---|---|---|---|"]
        helps = field_help(cls)
        for item in dataclasses.fields(cls):
            default = _scalar(default_of(item)).replace("|", "\\|")
            help_text = helps.get(item.name, "").replace("|", "\\|")
            lines.append(f"| `{item.name}` | `{default}` | {rule_of(item)} | {help_text} |")
        lines.append("")
    return "\n".join(lines)
