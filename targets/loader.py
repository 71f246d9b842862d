"""Finding and reading target profiles: built-in names, user files, and `extends:` overrides."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from edge_runtime.bounded_read import read_text_bounded
from edge_runtime.errors import ProfileSchemaError, UnknownTargetError
from edge_runtime.targets.schema import TargetProfile, parse_profile

BUILTIN_DIR = Path(__file__).resolve().parent


def known_targets() -> tuple[str, ...]:
    """Names of the built-in profiles (the YAML files shipped in this package), sorted."""
    return tuple(sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml")))


# Target detection reads every built-in profile at each start; libyaml's parser (where PyYAML was built with
# it) reads them several times faster. Only for the shipped files: a user's file keeps the pure-Python
# parser's error messages.
_BUILTIN_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# A user's profile file: a few dozen lines. Read only if a regular file this small (a FIFO would block,
# /dev/zero never end), and with few aliases: YAML's anchors let a kilobyte file stand for billions of nodes
# ("billion laughs"), and the built-in profiles use none.
MAX_PROFILE_BYTES = 1 << 20
MAX_ALIASES = 16


class _ProfileLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a document with more than MAX_ALIASES aliases as it is composed."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise ProfileSchemaError(f"{self.name}: more than {MAX_ALIASES} YAML aliases (*name); a target "
                                         "profile needs none")  # fmt: skip
        return super().compose_node(parent, index)


def _read_yaml(path: Path, *, builtin: bool = False) -> Any:
    if builtin:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UnknownTargetError(f"cannot read target profile {path}: {exc.strerror or exc}") from exc
    else:
        text = read_text_bounded(path, MAX_PROFILE_BYTES, "target profile", UnknownTargetError)
    try:
        if builtin:
            return yaml.load(text, Loader=_BUILTIN_LOADER)
        loader = _ProfileLoader(text)
        loader.name = str(path)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except RecursionError:  # thousands of nested [ or {
        raise ProfileSchemaError(f"{path}: nested too deeply to be a target profile") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ProfileSchemaError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from exc


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge mappings; lists and scalars in `override` replace the base's."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _load_builtin(name: str) -> TargetProfile:
    path = BUILTIN_DIR / f"{name}.yaml"
    profile = parse_profile(_read_yaml(path, builtin=True), str(path))
    if profile.name != name:
        raise ProfileSchemaError(f"{path}: 'name' = {profile.name!r} must equal the file name {name!r}")
    return profile


def _load_file(path: Path) -> TargetProfile:
    data = _read_yaml(path)
    if isinstance(data, dict) and "extends" in data:
        # A user file may restate only what differs from a built-in profile.
        data = dict(data)
        base = data.pop("extends")
        if not isinstance(base, str) or base not in known_targets():
            raise ProfileSchemaError(
                f"{path}: 'extends' = {base!r} must name a built-in target: {', '.join(known_targets())}"
            )
        data.setdefault("name", path.stem)
        quant = data.get("quantization")
        if isinstance(quant, str) and not quant.startswith("int4") and "mixed_precision" not in data:
            # the base's mixed-precision plan is for its INT4 default: a file that changes to int8 or none
            # drops it, as `edge-export --quant int8` does, rather than inherit a plan it cannot have
            data["mixed_precision"] = "none"
        data = _merge(_read_yaml(BUILTIN_DIR / f"{base}.yaml", builtin=True), data)
    return parse_profile(data, str(path))


def _looks_like_path(spec: str) -> bool:
    return os.sep in spec or "/" in spec or spec.endswith((".yaml", ".yml"))


def load_target(name_or_path: str | os.PathLike[str]) -> TargetProfile:
    """Load a target profile by built-in name (`orin-nano`) or from a YAML file path.

    A path always wins over a built-in of the same name, so a user can override any built-in by
    copying it; a file may also say `extends: <built-in>` and restate only the keys it changes.
    """
    spec = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or _looks_like_path(spec):
        path = Path(spec).expanduser()
        if not path.exists():  # there but not a file (a FIFO, a directory): _read_yaml says so
            raise UnknownTargetError(
                f"target profile file {spec!r} does not exist; pass an existing YAML file "
                f"or a built-in target: {', '.join(known_targets())}"
            )
        return _load_file(path)
    if spec not in known_targets():
        raise UnknownTargetError(
            f"unknown target {spec!r}; known targets: {', '.join(known_targets())} "
            "(or 'auto' to detect, or a path to a profile YAML)"
        )
    return _load_builtin(spec)
