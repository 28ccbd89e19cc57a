"""Load and validate a configuration against the config schema, fill defaults, and run each
study's semantic checks.

The schema is configs/schema.yaml (shared keys) completed from the registered studies
(hpcdl.platform.kit.study): the `studies` enum and one `<study>: {$ref: schema/<study>.yaml}` per study, so
adding a study edits no shared file. `write_full_schema` gives Snakemake's validate() the same.

Every error is a ConfigError naming the key, the bad value and what is allowed.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.util
import json
import sys
from pathlib import Path, PurePosixPath

import yaml
from jsonschema import Draft202012Validator, validators
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from hpcdl.platform.kit.study import registered

CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"
SCHEMA_PATH = CONFIG_DIR / "schema.yaml"
# Under schema/: what every study block accepts besides its own keys, one definition each: the
# `tuned` notes, the `exploration` seeds apart from the confirmation ones (hpcdl.platform.kit.confirmation),
# the device (hpcdl.platform.kit.device) and whether ranks may share a GPU.
SHARED_BLOCK_KEYS = {"tuned": "tuned.yaml", "exploration": "exploration.yaml", "device": "device.yaml",
                     "gpu_sharing": "gpu_sharing.yaml"}


def studies() -> tuple[str, ...]:
    """The registered studies' names, in name order (found on first call, not at import: importing
    this module loads no study)."""
    return tuple(registered())


class ConfigError(ValueError):
    """A configuration value that is not allowed; str() names key, value and what is allowed."""

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"config key '{key}': {value!r} is not allowed; allowed: {allowed}")


def _with_defaults(cls):
    validate_properties = cls.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(cls, {"properties": set_defaults})


_DefaultFillingValidator = _with_defaults(Draft202012Validator)


def _schema_file(path: Path) -> dict:
    contents = yaml.safe_load(path.read_text())
    # A `$schema` key would switch the sub-schema to a plain validator class that fills no defaults.
    contents.pop("$schema", None)
    return contents


def block_schema(path: Path) -> dict:
    """A study block's schema file, with the keys every study block accepts (SHARED_BLOCK_KEYS) added."""
    contents = _schema_file(path)
    if path.parent.name == "schema" and path.stem in studies():
        props = contents.setdefault("properties", {})
        for key, file in SHARED_BLOCK_KEYS.items():
            if key in props:
                raise ValueError(f"{path}: key {key!r} is defined once for every study in "
                                 f"{path.parent / file}; remove it from the study's schema")
            props[key] = _schema_file(path.parent / file)
    return contents


def _registry(schema_dir: Path) -> Registry:
    def retrieve(uri: str):
        path = Path(uri.removeprefix("file://"))
        if not path.is_absolute():
            path = schema_dir / path
        return Resource.from_contents(block_schema(path), default_specification=DRAFT202012)
    return Registry(retrieve=retrieve)


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    """The shared schema plus every registered study's enum entry and block `$ref` (absolute)."""
    path = Path(path)
    schema = yaml.safe_load(path.read_text())
    props = schema["properties"]
    names = list(studies())
    props["studies"]["items"] = {"enum": names}
    props["studies"]["default"] = names
    for study in names:
        block = path.parent / "schema" / f"{study}.yaml"
        if not block.exists():
            raise FileNotFoundError(f"study {study!r} is registered but has no schema file {block}")
        props[study] = {"$ref": str(block)}
    return schema


def write_full_schema(out: str | Path) -> Path:
    """load_schema() as a file, for Snakemake's validate() (which takes a path); each study's block
    schema is written beside it as `block_schema` gives it, since Snakemake reads the files as they are."""
    from hpcdl.platform.kit.atomic import atomic_write_text

    out = Path(out)
    schema = load_schema()
    for study in studies():
        contents = {"$schema": schema["$schema"], **block_schema(CONFIG_DIR / "schema" / f"{study}.yaml")}
        block = atomic_write_text(out.parent / "blocks" / f"{study}.yaml",
                                  yaml.safe_dump(contents, sort_keys=False))
        schema["properties"][study] = {"$ref": str(block.absolute())}
    return atomic_write_text(out, yaml.safe_dump(schema, sort_keys=False))


def _has_key(block: dict, dotted: str) -> bool:
    node = block
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _check_tuned(cfg: dict) -> None:
    """Each `tuned` note names a key its block has (the note must not outlive the key); so does each
    `exploration` entry (the key whose confirmation seeds it stands apart from)."""
    for study in cfg["studies"]:
        for i, note in enumerate(cfg[study].get("tuned", [])):
            if not _has_key(cfg[study], note["key"]):
                raise ConfigError(f"{study}.tuned[{i}].key", note["key"], f"a key of the {study} block")
        for key in cfg[study].get("exploration", {}):
            if key in SHARED_BLOCK_KEYS or not _has_key(cfg[study], key):
                raise ConfigError(f"{study}.exploration.{key}", cfg[study]["exploration"][key],
                                  f"an entry named for a seed or input key of the {study} block")


def _key(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _allowed(error) -> str:
    s, v = error.schema, error.validator
    if v == "enum":
        return ", ".join(map(str, s["enum"]))
    if v == "const":
        return repr(s["const"])
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        bounds = [f"{op} {s[k]}" for k, op in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                               ("maximum", "<="), ("exclusiveMaximum", "<")) if k in s]
        return "a number " + " and ".join(bounds)
    if v == "type":
        return f"a value of type {s['type']}"
    if v in ("minItems", "maxItems"):
        return f"a list with {'at least' if v == 'minItems' else 'at most'} {s[v]} items"
    if v in ("minLength", "pattern"):
        return f"a string matching {s.get('pattern', 'non-empty')}"
    if v == "additionalProperties":
        return "known keys: " + ", ".join(sorted(s.get("properties", {})))
    if v == "required":
        return "required keys: " + ", ".join(s["required"])
    if v == "uniqueItems":
        return "a list without repeated items"
    return error.message


def _to_config_error(error) -> ConfigError:
    # Report the most specific failing sub-error (e.g. the enum inside an anyOf).
    while error.context:
        error = min(error.context, key=lambda e: len(e.relative_schema_path))
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return ConfigError(_key(path + extra[:1]), error.instance.get(extra[0]) if extra else None,
                           _allowed(error))
    if error.validator == "required":
        missing = [k for k in error.schema["required"] if k not in error.instance]
        return ConfigError(_key(path + missing[:1]), None, _allowed(error))
    return ConfigError(_key(path), error.instance, _allowed(error))


def validate_config(cfg: dict, schema_path: Path = SCHEMA_PATH) -> dict:
    """Return a validated deep copy of `cfg` with schema defaults filled in; raise ConfigError."""
    cfg = copy.deepcopy(dict(cfg))
    if not isinstance(cfg.get("studies", []), list):
        raise ConfigError("studies", cfg["studies"], "a list of: " + ", ".join(studies()))
    # Every study that runs gets its block, so its defaults are filled in.
    for study in cfg.get("studies", studies()):
        if study in studies():
            cfg.setdefault(study, {})
    schema = load_schema(schema_path)
    validator = _DefaultFillingValidator(schema, registry=_registry(Path(schema_path).parent))
    errors = sorted(validator.iter_errors(cfg), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise _to_config_error(errors[0])
    check_results_dir(cfg["results_dir"])
    _check_tuned(cfg)
    for study in cfg["studies"]:
        module = f"hpcdl.studies.{study}.checks"
        if importlib.util.find_spec(f"hpcdl.studies.{study}") and importlib.util.find_spec(module):
            importlib.import_module(module).check(cfg)
    return cfg


def check_results_dir(value: str) -> None:
    p = PurePosixPath(value)
    if p.is_absolute() or ".." in p.parts:
        # Tests may point results anywhere absolute; configs in the repo stay relative.
        if p.is_absolute() and ".." not in p.parts:
            return
        raise ConfigError("results_dir", value, "a relative path without '..' (outputs stay in the project)")


def check_inside(key: str, value: str, base: str) -> Path:
    """A path option (relative to `base`, normally results_dir) must not escape it."""
    p = PurePosixPath(value)
    if p.is_absolute() or ".." in p.parts:
        raise ConfigError(key, value, f"a relative path inside the results directory {base!r}")
    return Path(base) / p


def read_config_file(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file {path} does not exist")
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"config file {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                         f"{exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping at the top level")
    return data


def load_config(path: str | Path, overrides: dict | None = None) -> dict:
    """Read a YAML/JSON config file, apply top-level overrides, validate, fill defaults."""
    cfg = read_config_file(path)
    cfg.update(overrides or {})
    return validate_config(cfg)


def study_config(cfg: dict, study: str) -> dict:
    """The part of a validated config one study depends on: shared keys plus its own block."""
    shared = {k: v for k, v in cfg.items() if k not in studies()}
    return {**shared, "studies": [study], study: cfg[study]}


def study_dir(cfg: dict, study: str) -> Path:
    """Absolute: under COMPSs a task runs in its sandbox directory, not where the app started."""
    return Path(cfg["results_dir"]).absolute() / study


def config_from_args(argv: list[str] | None = None, description: str | None = None) -> dict:
    """Parse `--config PATH` and load it; a bad config prints the error and exits 2, writing nothing.

    The one command line every task app shares (`python -m tasks.<study> --config FILE`).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="full config file (YAML or JSON)")
    args = parser.parse_args(argv)
    try:
        return load_config(args.config)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
