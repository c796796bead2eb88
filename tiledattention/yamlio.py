"""The one YAML loader for configs a user (or an attacker) wrote.

Safe types only, and stricter than ``yaml.safe_load``: aliases are refused (an alias bomb
of a few hundred bytes expands to gigabytes and hangs whoever walks it), duplicate keys are
refused (last-wins hides a typo), and the file is capped in size. Errors name the file and
line, never the (expanded) value.

    from tiledattention.yamlio import load_yaml
    config = load_yaml("config/study.yaml")          # a mapping, or YAMLInputError
"""

from __future__ import annotations

import yaml

from .errors import TiledAttentionError

MAX_BYTES = 1 << 20  # a config is a page or two; 1 MiB is generous


class YAMLInputError(TiledAttentionError, ValueError):
    """A YAML file is unreadable, malformed, too large, uses aliases or repeats a key."""


class _StrictLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise YAMLInputError(f"line {mark.line + 1}: YAML aliases (*name) are not "
                                 "allowed in a config; write the value out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: let the base class say so
                break
            if duplicate:
                raise YAMLInputError(f"line {key_node.start_mark.line + 1}: key {key!r} is "
                                     "given more than once")
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str | bytes, where: str = "<string>"):
    """The data of one YAML document (any type), or YAMLInputError naming ``where``."""
    if len(text) > MAX_BYTES:
        raise YAMLInputError(f"{where}: {len(text)} bytes, more than the {MAX_BYTES} a config "
                             "may have")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise YAMLInputError(f"{where}: not UTF-8 text (byte {exc.start})") from exc
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except YAMLInputError as exc:
        raise YAMLInputError(f"{where}: {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f"line {mark.line + 1}: " if mark else ""
        raise YAMLInputError(f"{where}: not valid YAML ({at}{exc.problem})") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise YAMLInputError(f"{where}: not valid YAML ({type(exc).__name__})") from None


def load_yaml(path: str, *, mapping: bool = True):
    """The data of the YAML file at ``path``; with ``mapping`` (default) it must be a
    non-empty mapping. Every failure is one YAMLInputError naming the path."""
    from .safeio import UnsafeFileError, read_bytes

    try:  # a FIFO or /dev/zero is refused before a byte is read
        text = read_bytes(path, cap=MAX_BYTES)
    except UnsafeFileError as exc:
        raise YAMLInputError(str(exc).replace("larger than the", "more than the")) from None
    data = parse_yaml(text, path)
    if mapping and not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise YAMLInputError(f"{path}: expected a mapping of keys to values, got {got}")
    return data
