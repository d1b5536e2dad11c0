"""Simulated hardware description, read from ``configs/*.toml`` into a frozen dataclass.

The runtime's own sections (``[soc] [node] [card] [ray] [host]``) become fields of :class:`Config`. A section
named after another of npusim's packages (``[hccl]``) is that package's: it registers its keys with
:func:`register_section` when imported, and they are checked as strictly as the runtime's — at load, or, for a
config loaded before the package was, when a key is first read (``cfg.exec_timeout``). Its values travel in
``Config.sections`` (a card actor rebuilds the config from :meth:`Config.to_dict`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from pathlib import Path

from .args import INT64_MAX, shown
from .constants import AclErrorCode
from .diag.callsite import PACKAGE_DIRS
from .errors import AclError
from .files import FileRefused, check_path, read_regular_file


def _config_dir() -> Path:
    """The shipped configs: ``rt/configs`` in an installed package (the wheel maps the project's top-level
    ``configs/`` there), else ``configs/`` beside the packages (a source checkout or an editable install)."""
    here = Path(__file__).resolve().parent
    packaged = here / "configs"
    return packaged if packaged.is_dir() else here.parent / "configs"


CONFIG_DIR = _config_dir()
TOPOLOGIES = ("fullmesh", "2x4")
MAX_CONFIG_BYTES = 1 << 20
MAX_SOC_NAME = 64
RAY_MEMORY_RESERVE = 100_000_000   # Ray refuses to start leaving less than this (or 5% of RAM) for tasks


@dataclasses.dataclass(frozen=True)
class Config:
    path: str
    soc_name: str = "Ascend910B1"
    cards_per_node: int = 8
    topology: str = "fullmesh"
    hbm_bytes: int = 2 << 30
    small_segment_bytes: int = 2 << 20
    large_segment_bytes: int = 20 << 20
    num_cpus: int = 2
    object_store_bytes: int = 1 << 30
    pinned_limit_bytes: int = 0        # pinned host memory (malloc_host) per process; 0 = half the RAM or cgroup limit
    sections: dict = dataclasses.field(default_factory=dict)   # other packages' sections, as the file gives them

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __getattr__(self, name: str):
        """A key of another package's section (``cfg.exec_timeout``): the file's value, else the registered
        default, checked; from a section whose package is not loaded here, the file's value as it is."""
        if name.startswith("_") or "sections" not in self.__dict__:
            raise AttributeError(name)
        value = _section_value(self, name)
        object.__setattr__(self, name, value)      # kept in the instance (frozen; not a field)
        return value


@dataclasses.dataclass(frozen=True)
class Key:
    """A key of a package's section (:func:`register_section`): its type, default and range (``note`` ends the
    range in a refusal, e.g. " seconds")."""

    type: type | tuple
    default: int | float | str
    lo: float
    hi: float
    note: str = ""


_FIELDS = {  # toml [section] key -> (field, type)
    ("soc", "name"): ("soc_name", str),
    ("node", "cards"): ("cards_per_node", int),
    ("node", "topology"): ("topology", str),
    ("card", "hbm_bytes"): ("hbm_bytes", int),
    ("card", "small_segment_bytes"): ("small_segment_bytes", int),
    ("card", "large_segment_bytes"): ("large_segment_bytes", int),
    ("ray", "num_cpus"): ("num_cpus", int),
    ("ray", "object_store_bytes"): ("object_store_bytes", int),
    ("host", "pinned_limit_bytes"): ("pinned_limit_bytes", int),
}   # then every registered section's keys (register_section): field = key
_OWN = {section for section, _ in _FIELDS}
_PACKAGES = {os.path.basename(os.path.dirname(d)) for d in PACKAGE_DIRS} - {"rt"}
_SECTIONS: dict[str, dict[str, Key]] = {}   # registered: section -> its keys
_SECTION_OF: dict[str, str] = {}             # registered: key (= field) -> section


def register_section(name: str, keys: dict[str, Key]) -> None:
    """The keys of ``[name]``, a section of the package ``name`` (one of npusim's): checked like the runtime's."""
    if name not in _PACKAGES or any(key in _RANGES and _SECTION_OF.get(key) != name for key in keys):
        raise ValueError(f"config section [{name}] of keys {sorted(keys)}: not a package's, or a key is taken")
    _SECTIONS[name] = dict(keys)
    for key, k in keys.items():
        _FIELDS[(name, key)] = (key, k.type)
        _RANGES[key] = (k.lo, k.hi, k.note)
        _KEYS[key] = f"[{name}] {key}"
        _SECTION_OF[key] = name


def resolve_path(config: str | os.PathLike | None) -> Path:
    """A path, a bare name from configs/ ('default', 'ascend910b'), or None → NPUSIM_CONFIG or default."""
    config = config or os.environ.get("NPUSIM_CONFIG") or "default"
    if not isinstance(config, (str, os.PathLike)):
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                       f"config {shown(config)} is neither a config name nor a path to a TOML file")
    try:
        check_path(config, "config")            # no NUL, not past PATH_MAX: the OS could not even look it up
        p = Path(config)
        if not p.exists() and not p.suffix:
            p = CONFIG_DIR / f"{config}.toml"
        found = p.exists()
    except (FileRefused, OSError) as e:         # OSError: a path component past NAME_MAX
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                       f"config {shown(str(config))}: not a usable config name or path "
                       f"({e.message if isinstance(e, FileRefused) else e.strerror})") from None
    if not found:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_FILE,
                       f"config {shown(str(config))} not found (looked at {p}; known: "
                       f"{sorted(q.stem for q in CONFIG_DIR.glob('*.toml'))})")
    return p.resolve()


def load_config(config: str | os.PathLike | Config | None = None) -> Config:
    """Read and validate a config; every bad key or value is named in the error."""
    if isinstance(config, Config):
        return config
    path = resolve_path(config)
    try:
        doc = tomllib.loads(read_regular_file(path, MAX_CONFIG_BYTES, "config").decode())
    except FileRefused as e:
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_FILE, e.message) from None
    except (ValueError, UnicodeDecodeError) as e:   # TOMLDecodeError, or an int past Python's digit limit
        raise AclError(AclErrorCode.ACL_ERROR_PARSE_FILE, f"config {path}: not valid TOML: {e}") from None
    except RecursionError:
        raise AclError(AclErrorCode.ACL_ERROR_PARSE_FILE, f"config {path}: not valid TOML: nested too deeply") from None
    values: dict = {"path": str(path), "sections": {}}
    for section, table in doc.items():
        if not isinstance(table, dict):
            raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID,
                           f"config {path}: top-level key {shown(section)} must be a [section]")
        if section in _PACKAGES:
            values["sections"][section] = table
            if section not in _SECTIONS:       # its package is not loaded here: it checks the keys it reads
                continue
        for key, value in table.items():
            if (section, key) not in _FIELDS:
                raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID,
                               f"config {path}: unknown key [{shown(section)}] {shown(key)} (known: "
                               f"{sorted(f'{s}.{k}' for s, k in _FIELDS)})")
            field, typ = _FIELDS[(section, key)]
            if not isinstance(value, typ) or isinstance(value, bool):
                raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID,
                               f"config {path}: [{section}] {key} = {shown(value)} has the wrong type "
                               f"(expected {_type_name(typ)})")
            if section in _OWN:
                values[field] = value
    cfg = Config(**values)
    problems = [p for p in (_out_of_range(field, _value(cfg, field)) for field in _RANGES) if p]
    if not problems:
        problems = _relations(cfg)
    if problems:
        raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID, f"config {path}: " + "; ".join(problems))
    return cfg


_GIB = 1 << 30
_RANGES = {  # field -> (lo, hi, note); every numeric field has one, so 2**80, 0, -1, nan and inf are named
    "cards_per_node": (1, 64, ""),
    "hbm_bytes": (1 << 20, 1 << 44, ""),
    "small_segment_bytes": (512, 1 << 44, ""),
    "large_segment_bytes": (512, 1 << 44, ""),
    "num_cpus": (1, 1024, ""),
    "object_store_bytes": (75 << 20, 1 << 50, ""),
    "pinned_limit_bytes": (0, INT64_MAX, "; 0 = half the host's (or the cgroup's) memory"),
}
_KEYS = {field: f"[{section}] {key}" for (section, key), (field, _) in _FIELDS.items()}


def _type_name(typ) -> str:
    return "a number" if isinstance(typ, tuple) else {int: "an integer", str: "a string"}[typ]


def _value(cfg: Config, field: str):
    """A field's value; a registered key's: the file's, else its default."""
    section = _SECTION_OF.get(field)
    if section is None:
        return getattr(cfg, field)
    return cfg.sections.get(section, {}).get(field, _SECTIONS[section][field].default)


def _section_value(cfg: Config, name: str):
    section = _SECTION_OF.get(name)
    if section is None:                         # a package not loaded here: the file's value as it is
        for table in cfg.sections.values():
            if name in table:
                return table[name]
        raise AttributeError(name)
    value = _value(cfg, name)
    typ = _SECTIONS[section][name].type
    if not isinstance(value, typ) or isinstance(value, bool):
        problem = f"[{section}] {name} = {shown(value)} has the wrong type (expected {_type_name(typ)})"
    else:
        problem = _out_of_range(name, value)
    if problem:                                 # the config was loaded before the package registered its keys
        raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID, f"config {cfg.path}: {problem}")
    return value


def _out_of_range(field: str, value) -> str | None:
    lo, hi, note = _RANGES[field]
    finite = not isinstance(value, float) or math.isfinite(value)
    if finite and lo <= value <= hi:
        return None
    return f"{_KEYS[field]} = {shown(value)} (expected a finite value in [{lo}, {hi}]{note})"


def _relations(cfg: Config) -> list[str]:
    """What a range cannot say: the names and the order of the two segment sizes."""
    problems = []
    if cfg.topology not in TOPOLOGIES:
        problems.append(f"[node] topology = {shown(cfg.topology)} (expected one of {TOPOLOGIES})")
    name = cfg.soc_name
    if not (0 < len(name) <= MAX_SOC_NAME and name.isascii() and name.isprintable()):
        problems.append(f"[soc] name = {shown(name)} (expected 1..{MAX_SOC_NAME} printable ASCII characters)")
    if cfg.small_segment_bytes > cfg.large_segment_bytes:
        problems.append(f"[card] small_segment_bytes = {cfg.small_segment_bytes} is larger than large_segment_bytes "
                        f"= {cfg.large_segment_bytes} (expected small <= large)")
    return problems


def check_object_store(cfg: Config) -> None:
    """Before an embedded Ray starts: Ray refuses (with a traceback, after creating its session directory) an
    object store that leaves it too little of the memory it may use — the host's, or a container's memory
    cgroup's — for tasks and actors. Not part of ``load_config``: a config is valid on a larger host, and the
    local backend never starts Ray."""
    from .memlimit import budget
    mem = budget()
    fits = max(0, mem.available - max(RAY_MEMORY_RESERVE, mem.total // 20))
    if cfg.object_store_bytes <= fits:
        return
    raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID,
                   f"config {cfg.path}: [ray] object_store_bytes = {cfg.object_store_bytes} "
                   f"({cfg.object_store_bytes / _GIB:.1f} GiB) does not fit: at most {fits} ({fits / _GIB:.1f} GiB) "
                   f"fits next to what Ray keeps for tasks and actors; {mem.describe()}")
