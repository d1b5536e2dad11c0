"""The frozen description of one launch, built and validated from CLI flags or ``spawn`` arguments.

Every check that can be made before anything starts is made here, so a bad request fails at once with
a message naming the flag, the bad value and what was expected — never as a hang later on.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import os
import socket
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from rt import copytune, faults
from rt.args import acl_param, integer, number, shown
from rt.config import Config, check_object_store, load_config
from rt.diag import callsite
from rt.host.runtime import parse_visible

DEFAULT_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when stopping ranks
MAX_GRACE = 3600.0   # longer would be a hung stop, not a grace period
MAX_TIMEOUT = 1e9    # ~31 years: any real limit; finite, so deadlines stay representable
MAX_CARDS = 64       # rt.config allows at most 64 cards per node
MAX_NNODES = 1024
MAX_RESTARTS = (1 << 31) - 1


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a job needs; immutable once built (restarts reuse it unchanged)."""

    program: tuple[str, ...]          # what follows `python -u` in each rank: script + args, -m mod, -c code
    name: str                         # the script/module shown in messages and the failure summary
    hw: Config                        # the simulated hardware (rt.config), already loaded
    nproc: int                        # ranks per node
    nnodes: int
    address: str | None               # Ray cluster to join; None = embedded local session
    max_restarts: int
    log_dir: str | None
    tee: int                          # streams copied to per-rank files: 1 stdout, 2 stderr, 3 both
    local_ranks_filter: frozenset[int] | None  # None = every local rank reaches the console
    rank_table: str | None            # where to write the rank table; None = the job's temp dir
    timeout: float | None             # whole-job wall limit in seconds
    grace: float                      # SIGTERM → SIGKILL delay
    cards: bool                       # False: no Ray and no card actors (internal test mode)
    python: str
    cwd: str
    env: dict = dataclasses.field(default_factory=dict)  # the base environment of every rank
    devices: tuple[int, ...] = ()     # physical cards of each node the ranks use (local rank i -> devices[i])
    master_addr: str | None = None    # MASTER_ADDR for torch's env:// (None: 127.0.0.1, or node 0's host)
    master_port: int | None = None    # MASTER_PORT (None: a free port chosen for each attempt)
    profile: str | None = None        # --profile: write the job's timeline (Chrome trace JSON) here
    inject: str | None = None         # --inject: the NPUSIM_FAULTS spec every rank gets (rt/diag/faults.py)

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def node_of(self, rank: int) -> int:
        return rank // self.nproc

    def local_rank_of(self, rank: int) -> int:
        return rank % self.nproc


def parse_ranks_filter(text: str | None, nproc: int) -> frozenset[int] | None:
    """'0,3' → {0, 3}; '' or None → None (no filter). Each entry must be a local rank < nproc."""
    if text is None or (isinstance(text, str) and text.strip() == ""):
        return None
    if not isinstance(text, str):
        raise acl_param(f"--local-ranks-filter {shown(text)}: expected a str of comma-separated local ranks "
                        f"such as '0,3'")
    ranks = set()
    for item in text.split(","):
        item = item.strip()
        # ASCII digits only: '²'.isdigit() is True but int('²') fails
        if not (item.isascii() and item.isdigit() and len(item) <= 4) or int(item) >= nproc:
            raise acl_param(f"--local-ranks-filter {shown(text)}: {shown(item)} is not a local rank "
                            f"(expected comma-separated integers in 0..{nproc - 1})")
        ranks.add(int(item))
    return frozenset(ranks)


def _check_program(program: tuple[str, ...]) -> str:
    """Validate the rank command line and return its display name."""
    if not program:
        raise acl_param("launch: no script given (usage: launch [options] script.py [args...] or -m module)")
    if program[0] == "-m":
        if len(program) < 2 or not program[1]:
            raise acl_param("launch -m: no module name given")
        if not all(part.isidentifier() for part in program[1].split(".")):   # python -m could never import it
            raise acl_param(f"launch -m {shown(program[1])}: not a module name (expected dotted Python "
                            "identifiers such as package.module)")
        source = _module_file(program[1])
        if source is not None:
            _compile(source, f"module {program[1]!r}")
        return program[1]
    if program[0] == "-c":
        return "-c"
    script = Path(program[0])
    try:
        found = script.is_file()
    except OSError as e:  # a name longer than NAME_MAX, a directory we may not search
        raise acl_param(f"launch: script {shown(program[0])}: {e.strerror}; expected a path to a Python file") from None
    if not found:
        raise acl_param(f"launch: script {shown(program[0])} not found (cwd {os.getcwd()}); "
                        "expected a path to a Python file, or -m module")
    _compile(script, f"script {program[0]!r}")
    return program[0]


def _compile(path: Path, what: str) -> None:
    """Fail now, before Ray and the cards start, if the program cannot even be compiled."""
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as e:
        detail = "".join(traceback.format_exception_only(type(e), e)).rstrip()
        raise acl_param(f"launch: {what} does not compile:\n{detail}") from None
    except OSError as e:
        raise acl_param(f"launch: cannot read {what}: {e}") from None


def _module_file(name: str) -> Path | None:
    """The source file ``python -m name`` would run from the working directory, found without importing
    anything (top-level modules and packages only; a dotted name needs its parents imported)."""
    if "." in name:
        return None
    spec = importlib.machinery.PathFinder.find_spec(name, [os.getcwd(), *sys.path[1:]])
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    origin = Path(spec.origin)
    if spec.submodule_search_locations is not None:          # a package runs its __main__
        origin = origin.parent / "__main__.py"
    return origin if origin.is_file() else None


def make_run_config(program, *, nproc=None, nnodes=1, address=None, config=None, max_restarts=0,
                    log_dir=None, tee=3, local_ranks_filter=None, rank_table=None, timeout=None,
                    grace=DEFAULT_GRACE, cards=True, env=None, name=None, master_addr=None,
                    master_port=None, profile=None, inject=None, call: str | None = None) -> RunConfig:
    """Validate a launch request; raises AclError(ACL_ERROR_INVALID_PARAM) naming the bad value. A bad count or
    duration is named as ``launch``'s flag (``--nproc 0: expected ...``), or, when the Python function ``call``
    (``"spawn"``) passes its own parameters on, as that parameter in rt/args.py's words (``spawn: nproc must be an
    int in [1, 64], got 0``); ``nproc=None`` is the config's cards per node only for ``launch`` (``--nproc auto``).
    """
    program = tuple(str(p) for p in program)
    display = name or _check_program(program)
    if program and program[0] not in ("-m", "-c"):
        program = (str(Path(program[0]).resolve()),) + program[1:]
    hw = load_config(config_name(config))  # AclError naming the file and the bad key on a malformed config
    base_env = _check_env(os.environ if env is None else env)
    visible_text = base_env.get("ASCEND_RT_VISIBLE_DEVICES")
    visible = parse_visible(visible_text, hw.cards_per_node)
    if nproc is None and call is None:
        nproc = len(visible) or hw.cards_per_node
    nproc, nnodes, max_restarts = _check_counts(nproc, nnodes, max_restarts, hw, visible, visible_text, call)
    if not cards and address:
        raise acl_param("--no-cards runs without Ray and cannot join --address")
    if cards and not address:
        check_object_store(hw)        # a usage error now, not Ray's traceback once it is starting
    if timeout is not None:
        timeout = _seconds(timeout, "--timeout", "timeout", lo=0.0, hi=MAX_TIMEOUT, positive=True, call=call)
    grace = _seconds(grace, "--grace-period", "grace", lo=0.0, hi=MAX_GRACE, call=call)
    if tee not in (0, 1, 2, 3) or isinstance(tee, bool):
        raise acl_param(f"--tee {shown(tee)}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both)")
    if master_port is not None and (isinstance(master_port, bool) or not isinstance(master_port, int)
                                    or not 1 <= master_port <= 65535):
        raise acl_param(f"--master-port {shown(master_port)}: expected a TCP port number 1..65535")
    if master_addr is not None and (not isinstance(master_addr, str) or not master_addr.strip()):
        raise acl_param(f"--master-addr {shown(master_addr)}: expected a host name or address")
    profile = output_path("--profile", profile)
    rank_table = output_path("--rank-table", rank_table)
    if inject is not None or base_env.get("NPUSIM_FAULTS"):
        _check_faults(inject if inject is not None else base_env["NPUSIM_FAULTS"],
                      "--inject" if inject is not None else "NPUSIM_FAULTS", nproc, nnodes, visible[:nproc])
        if inject is not None:
            base_env["NPUSIM_FAULTS"] = inject
    ranks_filter = parse_ranks_filter(local_ranks_filter, nproc)
    log_dir = _log_dir(log_dir)       # last: it creates the directory, which a refused request must not leave
    return RunConfig(
        program=program, name=display, hw=hw, nproc=nproc, nnodes=nnodes, address=address or None,
        max_restarts=max_restarts, log_dir=log_dir, tee=tee,
        local_ranks_filter=ranks_filter, rank_table=rank_table,
        timeout=timeout, grace=grace, cards=bool(cards),
        python=os.environ.get("PYTHON_EXEC") or sys.executable, cwd=os.getcwd(), env=base_env,
        devices=tuple(visible[:nproc]), master_addr=master_addr, master_port=master_port, profile=profile,
        inject=inject)


def config_name(config):
    """--config as a name or path the OS can look up: a NUL or an over-long name would be an OSError there."""
    if isinstance(config, str) and ("\0" in config or len(config.encode(errors="replace")) >= 4096
                                    or any(len(part.encode(errors="replace")) > 255 for part in config.split("/"))):
        raise acl_param(f"--config {shown(config)}: expected a config name (such as 'default') or a path to a "
                        "TOML file")
    return config


def _count(value, flag: str, param: str, lo: int, hi: int, what: str, call: str | None) -> int:
    """An int in lo..hi (rt/args.py decides), refused in the asker's words: as the parameter ``param`` of the Python
    function ``call`` (rt/args.py's), else as launch's ``flag``."""
    def as_flag(_message):
        return acl_param(f"{flag} {shown(value)}: expected {what} ({lo}..{hi})")
    return integer(value, call or "launch", param, lo=lo, hi=hi, error=acl_param if call else as_flag)


def _check_counts(nproc, nnodes, max_restarts, hw: Config, visible, visible_text, call) -> tuple[int, int, int]:
    """Ranks per node, nodes and restarts: integers in range, and no more ranks per node than cards."""
    nproc = _count(nproc, "--nproc", "nproc", 1, MAX_CARDS, "a positive number of ranks per node", call)
    nnodes = _count(nnodes, "--nnodes", "nnodes", 1, MAX_NNODES, "a positive number of nodes", call)
    max_restarts = _count(max_restarts, "--max-restarts", "max_restarts", 0, MAX_RESTARTS, "a number of restarts",
                          call)
    if visible_text is not None and nproc > len(visible):
        raise acl_param(f"--nproc {nproc}: ASCEND_RT_VISIBLE_DEVICES={visible_text!r} leaves {len(visible)} visible "
                        f"card(s) per node ({visible}); each rank needs its own card. Unset the variable or "
                        f"list more cards")
    if nproc > hw.cards_per_node:
        raise acl_param(
            f"--nproc {nproc} asks for more ranks per node than the {hw.cards_per_node} cards per node of "
            f"config {hw.path}; each rank needs its own card. To get more cards, use a config with "
            f"more cards per node (--config FILE with [node] cards = {nproc}), or spread the ranks over "
            f"several nodes with --nnodes")
    return nproc, nnodes, max_restarts


def _seconds(value, flag: str, param: str, *, lo: float, hi: float, positive: bool = False,
             call: str | None = None) -> float:
    """A finite duration in lo..hi (inf would overflow the waits: threading refuses timeouts > TIMEOUT_MAX), decided
    and worded as ``_count``; ``positive``: 0 is refused too."""
    kind = "a positive" if positive else "a"

    def as_flag(_message=None):
        return acl_param(f"{flag} {shown(value)}: expected {kind} number of seconds in {lo:g}..{hi:g}")
    seconds = number(value, call or "launch", param, lo=lo, hi=hi, error=acl_param if call else as_flag)
    if positive and seconds <= 0:
        raise as_flag()
    return seconds


def _log_dir(log_dir) -> str | None:
    """--log-dir: created now (it would be at the job's start anyway), so an unusable one is a usage error."""
    if log_dir is None:
        return None
    path = _path("--log-dir", log_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise acl_param(f"--log-dir {shown(str(log_dir))}: cannot create the directory ({e.strerror})") from None
    if not path.is_dir():
        raise acl_param(f"--log-dir {shown(str(path))} exists and is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise acl_param(f"--log-dir {shown(str(path))}: the directory is not writable")
    return str(path)


def output_path(flag: str, value) -> str | None:
    """A file launch writes (--profile, --rank-table): its directory exists, and it is not a directory itself."""
    if value is None:
        return None
    path = _path(flag, value)
    try:
        is_dir, parent_ok = path.is_dir(), path.parent.is_dir()
    except OSError as e:  # a name longer than NAME_MAX, a directory we may not search
        raise acl_param(f"{flag} {shown(str(path))}: not a usable path ({e.strerror})") from None
    if is_dir:
        raise acl_param(f"{flag} {shown(str(path))} is a directory; expected a file path")
    if not parent_ok:
        raise acl_param(f"{flag} {shown(str(path))}: directory {shown(str(path.parent))} does not exist")
    return str(path)


def _path(flag: str, value) -> Path:
    """A str/PathLike naming a path the OS can take (no NUL, not longer than PATH_MAX), made absolute."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value or "\0" in value or len(value.encode(errors="replace")) >= 4096:
        raise acl_param(f"{flag} {shown(value)}: expected a file system path")
    try:
        return Path(value).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop, a component longer than NAME_MAX
        raise acl_param(f"{flag} {shown(value)}: not a usable path ({e})") from None


def _check_env(env) -> dict:
    """The ranks' base environment: str names and values execve accepts (no '=' in a name, no NUL)."""
    if not isinstance(env, Mapping):
        raise acl_param(f"env {shown(env)}: expected a dict of environment variables (str -> str)")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise acl_param(f"env: variable name {shown(key)} is not a valid environment variable name")
        if not isinstance(value, str) or "\0" in value:
            raise acl_param(f"env: {key}={shown(value)}: expected a str value without NUL bytes")
    return dict(env)


def _check_faults(spec, source: str, nproc: int, nnodes: int, cards) -> None:
    """A fault spec every rank will get (rt/diag/faultspec.py): well formed, and naming ranks and cards the job has."""
    if not isinstance(spec, str):
        raise acl_param(f"{source} {spec!r}: expected a fault spec string such as 'kill:rank=1:collective=3'")
    for f in faults.parse(spec, source):
        if f.rank is not None and f.rank >= nproc * nnodes:
            raise acl_param(f"{source}: fault {f.text!r}: rank {f.rank} is not a rank of this job (ranks 0.."
                            f"{nproc * nnodes - 1})")
        if f.card is not None and (f.card not in cards or f.node >= nnodes):
            raise acl_param(f"{source}: fault {f.text!r}: card {f.card} of node {f.node} runs no rank of this job "
                            f"(its ranks use cards {list(cards)} of nodes 0..{nnodes - 1})")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for MASTER_PORT when --master-port is not given)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def common_rank_env(rc: RunConfig) -> dict:
    """What every rank's environment has before its own variables: also what its fork server starts with."""
    env = dict(rc.env)
    env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N ranks must not each spawn a thread per core
    # npusim's own directory, so ranks import the same npusim as the launcher whether or not it is installed; after
    # the user's own entries: a real pyACL that CANN's set_env.sh put there is imported before npusim's.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), callsite.ROOT) if p)
    env.update(copytune.tuned(env))         # large copies with non-temporal stores (rt/copytune.py)
    return env


def rank_env(rc: RunConfig, rank: int, *, job_id: str, attempt: int, rank_table_file: str,
             node_extra: dict, master: tuple[str, int] = ("127.0.0.1", 29500)) -> dict:
    """The environment of one rank process (DESIGN §5); node_extra adds NPUSIM_CARD_DIR etc.;
    ``master`` is torch's (MASTER_ADDR, MASTER_PORT)."""
    node = rc.node_of(rank)
    local = rc.local_rank_of(rank)
    env = common_rank_env(rc)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(rc.world_size),
        "LOCAL_WORLD_SIZE": str(rc.nproc), "NODE_RANK": str(node), "GROUP_RANK": str(node),
        "RANK_ID": str(rank), "RANK_SIZE": str(rc.world_size),
        "DEVICE_ID": str(local), "ASCEND_DEVICE_ID": str(local),
        "RANK_TABLE_FILE": rank_table_file, "RESTART_COUNT": str(attempt),
        "MAX_RESTARTS": str(rc.max_restarts), "MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]),
        "NPUSIM_JOB": job_id, "NPUSIM_NODE": str(node), "NPUSIM_CONFIG": rc.hw.path,
        "NPUSIM_JOB_CARDS": ",".join(map(str, rc.devices)),     # the cards the job boots on each node
    })
    env.update(node_extra)
    return env
