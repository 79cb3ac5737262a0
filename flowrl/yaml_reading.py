"""Reading YAML that someone else may have written (configs, overrides, a run folder's config.yaml), bounded:
PyYAML's safe loader with no aliases, a size and a depth cap, plain keys and no key given twice, and YAML
1.2's booleans (only true and false: ``training.mixed_precision=no`` is the string "no", not YAML 1.1's
False); anything malformed or refused is one :class:`~flowrl.config_schema.ConfigError` line naming the source."""

from __future__ import annotations

import re
from typing import Any

import yaml

from flowrl.config_schema import ConfigError

#: the most characters of YAML flowrl parses at once (a config is a few KB; a run folder's config.yaml is read
#: by the demo, so its size must not be the author's choice)
MAX_YAML_CHARS = 1_000_000
#: the deepest nesting of mappings and lists flowrl's YAML may have (its configs need 5)
MAX_YAML_DEPTH = 32


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader (plain data only, no tags that build objects), bounded: no aliases (``*name``,
    whose expansion a few hundred bytes can make gigabytes), nesting at most :data:`MAX_YAML_DEPTH` deep, keys
    that are plain scalars, and a key given twice in one mapping refused (PyYAML would keep the last)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed", mark)
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", mark
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a plain value, not a list or a mapping", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_BOOL_TAG = "tag:yaml.org,2002:bool"
_BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_BoundedLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_yaml(text: str, source: str) -> Any:
    """``text`` read as YAML (safe and bounded: :class:`_BoundedLoader`, at most :data:`MAX_YAML_CHARS`); a
    :class:`ConfigError` naming ``source`` and the line for malformed or refused input."""
    if len(text) > MAX_YAML_CHARS:
        raise ConfigError(
            f"{source} is {len(text):,} characters of YAML; flowrl reads at most {MAX_YAML_CHARS:,}"
        )
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{source} is not valid YAML{where}: {problem}") from None
    except (ValueError, TypeError, IndexError, AttributeError) as error:  # a typed tag whose value is not one
        raise ConfigError(f"{source} is not valid YAML: a tagged value cannot be read ({error})") from None
