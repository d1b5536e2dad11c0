"""Simulated hardware description, read from ``configs/*.toml`` into a frozen dataclass."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path

from .constants import AclErrorCode
from .errors import AclError
from .files import FileRefused, read_regular_file


def _config_dir() -> Path:
    """The shipped configs: ``rt/configs`` in an installed package (the wheel maps the project's top-level
    ``configs/`` there), else ``configs/`` beside the packages (a source checkout or an editable install)."""
    here = Path(__file__).resolve().parent
    packaged = here / "configs"
    return packaged if packaged.is_dir() else here.parent / "configs"


CONFIG_DIR = _config_dir()
TOPOLOGIES = ("fullmesh", "2x4")
MAX_CONFIG_BYTES = 1 << 20


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
    exec_timeout: float = 1836.0
    connect_timeout: float = 120.0
    buffsize_mb: int = 200
    ring_threshold_bytes: int = 0      # one node: mesh up to this size, ring above (0 = always mesh)
    pinned_limit_bytes: int = 0        # pinned host memory (malloc_host) per process; 0 = half the host's RAM

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_FIELDS = {  # toml [section] key -> (field, type)
    ("soc", "name"): ("soc_name", str),
    ("node", "cards"): ("cards_per_node", int),
    ("node", "topology"): ("topology", str),
    ("card", "hbm_bytes"): ("hbm_bytes", int),
    ("card", "small_segment_bytes"): ("small_segment_bytes", int),
    ("card", "large_segment_bytes"): ("large_segment_bytes", int),
    ("ray", "num_cpus"): ("num_cpus", int),
    ("ray", "object_store_bytes"): ("object_store_bytes", int),
    ("hccl", "exec_timeout"): ("exec_timeout", (int, float)),
    ("hccl", "connect_timeout"): ("connect_timeout", (int, float)),
    ("hccl", "buffsize_mb"): ("buffsize_mb", int),
    ("hccl", "ring_threshold_bytes"): ("ring_threshold_bytes", int),
    ("host", "pinned_limit_bytes"): ("pinned_limit_bytes", int),
}


def resolve_path(config: str | os.PathLike | None) -> Path:
    """A path, a bare name from configs/ ('default', 'ascend910b'), or None → NPUSIM_CONFIG or default."""
    config = config or os.environ.get("NPUSIM_CONFIG") or "default"
    if not isinstance(config, (str, os.PathLike)):
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_PARAM,
                       f"config {config!r} is neither a config name nor a path to a TOML file")
    p = Path(config)
    if not p.exists() and not p.suffix:
        p = CONFIG_DIR / f"{config}.toml"
    if not p.exists():
        raise AclError(AclErrorCode.ACL_ERROR_INVALID_FILE,
                       f"config {str(config)!r} not found (looked at {p}; known: "
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
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise AclError(AclErrorCode.ACL_ERROR_PARSE_FILE, f"config {path}: not valid TOML: {e}") from None
    values: dict = {"path": str(path)}
    for section, table in doc.items():
        if not isinstance(table, dict):
            raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID,
                           f"config {path}: top-level key {section!r} must be a [section]")
        for key, value in table.items():
            if (section, key) not in _FIELDS:
                raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID,
                               f"config {path}: unknown key [{section}] {key} (known: "
                               f"{sorted(f'{s}.{k}' for s, k in _FIELDS)})")
            field, typ = _FIELDS[(section, key)]
            if not isinstance(value, typ) or isinstance(value, bool):
                raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID,
                               f"config {path}: [{section}] {key} = {value!r} has the wrong type")
            values[field] = value
    cfg = Config(**values)
    problems = []
    if not 1 <= cfg.cards_per_node <= 64:
        problems.append(f"[node] cards = {cfg.cards_per_node} (expected 1..64)")
    if cfg.topology not in TOPOLOGIES:
        problems.append(f"[node] topology = {cfg.topology!r} (expected one of {TOPOLOGIES})")
    if cfg.hbm_bytes < 1 << 20:
        problems.append(f"[card] hbm_bytes = {cfg.hbm_bytes} (expected at least 1 MiB)")
    if cfg.small_segment_bytes <= 0 or cfg.large_segment_bytes < cfg.small_segment_bytes:
        problems.append("[card] segment sizes must be positive and large >= small")
    if cfg.num_cpus < 1 or cfg.object_store_bytes < 75 << 20:
        problems.append("[ray] num_cpus must be >= 1 and object_store_bytes >= 75 MiB")
    if cfg.pinned_limit_bytes < 0:
        problems.append(f"[host] pinned_limit_bytes = {cfg.pinned_limit_bytes} (expected >= 0; 0 = half the RAM)")
    if cfg.exec_timeout < 0 or cfg.connect_timeout < 0:
        problems.append("[hccl] timeouts must be >= 0")
    if problems:
        raise AclError(AclErrorCode.ACL_ERROR_FILE_ATTR_INVALID, f"config {path}: " + "; ".join(problems))
    return cfg
