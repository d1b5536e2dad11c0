"""The Ray side of the launcher: the Ray session, node placement, node agents and each attempt's cards.

The session is reused when the caller already has one (e.g. a session-scoped test fixture calling
``spawn``), joined with ``--address``, or else embedded (started here on 127.0.0.1 and stopped at the
end). Node n of the job is a Ray node offering at least ``nproc`` ``NPU``; node 0 is the launcher's
own node when it has cards. A ``NodeAgent`` runs the ranks of each node: on the launcher's own node
it runs inside this process (no Ray worker to boot first, so the ranks start as soon as the cards
are requested); on every other node it is a Ray actor pinned there with
NodeAffinitySchedulingStrategy. The card actors are created per attempt (a restart gets fresh
cards) through ``rt/ray/session.py``. Ray is imported only when this backend is used.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from rt import args
from rt.constants import AclErrorCode
from rt.errors import AclError

from ..agent import NodeAgent
from ..forkserver import client as forkserver
from .config import common_rank_env
from .progress import JoinProgress

AGENT_START_TIMEOUT = 60.0
AGENT_POLL = 0.5   # seconds an agent's long poll may block
DRIVER_WAIT = 0.2  # seconds the job loop waits per poll, so signals and deadlines are noticed quickly


def place_nodes(nodes: list[dict], nnodes: int, nproc: int, local_node_id: str | None, where: str) -> list[dict]:
    """Pick nnodes Ray nodes with >= nproc NPU, the launcher's own node first; refuse clearly if too few."""
    eligible = [n for n in nodes if n["npus"] >= nproc]
    eligible.sort(key=lambda n: (n["node_id"] != local_node_id, n["ip"], n["node_id"]))
    if len(eligible) >= nnodes:
        return eligible[:nnodes]
    seen = ", ".join(f"{n['ip']} (node {n['node_id'][:8]}): NPU={n['npus']}" for n in nodes) or "none"
    raise AclError(
        AclErrorCode.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL,
        f"launch: --nnodes {nnodes} --nproc {nproc} needs {nnodes} Ray node(s) offering at least {nproc} NPU "
        f"each, but the Ray cluster at {where} has {len(eligible)} such node(s) (nodes with NPU: {seen}). "
        f"Add nodes with `ray start --address=<head> --resources='{{\"NPU\": {nproc}}}'`, or lower --nnodes/--nproc")


CARD_BOOT_WAIT = 60.0      # s for the cards of an attempt to serve, plus CARD_BOOT_EACH per card
CARD_BOOT_EACH = 1.0       # (a card's boot is ~0.7 s of CPU; all of them share the machine's cores)
PROGRESS_FROM = 16         # worlds with more cards report their boot as it goes


# What a job costs this machine before the program allocates anything (PSS measured 2 Dec 2026 with a program
# holding one communicator): Ray's own processes, the job board and launch ~0.45 GiB; a Ray worker holding cards
# ~56 MiB plus ~4 MiB a card (a CardActor 57-62 MiB, a CardHost of 8 cards 88 MiB); a rank forked from the fork
# server 12 MiB (numpy, rt, hccl shared with the server).
WORLD_BASE_BYTES = 450 << 20
CARD_WORKER_BYTES = 56 << 20
CARD_BYTES = 4 << 20
RANK_BYTES = 12 << 20


def check_world_fits(nnodes: int, nproc: int, per_host: int = 1) -> None:
    """Refuse at once a world whose cards and ranks alone cannot fit in the memory this machine (or its
    container) has available — it would otherwise swap or be killed partway through booting."""
    from rt.memlimit import budget
    world = nnodes * nproc
    workers = nnodes * -(-nproc // per_host)
    need = WORLD_BASE_BYTES + workers * CARD_WORKER_BYTES + world * (CARD_BYTES + RANK_BYTES)
    mem = budget()
    if need <= mem.available:
        return
    gib = 1 << 30
    raise AclError(AclErrorCode.ACL_ERROR_RT_MEMORY_ALLOCATION,
                   f"launch: --nnodes {nnodes} --nproc {nproc} ({world} ranks and cards, in {workers} card processes) "
                   f"needs about {need / gib:.1f} GiB before the program allocates anything ({CARD_WORKER_BYTES >> 20} "
                   f"MiB a card process, {CARD_BYTES >> 20} MiB a card, {RANK_BYTES >> 20} MiB a rank, "
                   f"{WORLD_BASE_BYTES >> 20} MiB for Ray and launch), but only {mem.available / gib:.1f} GiB is "
                   f"available ({mem.describe()}); lower --nnodes or --nproc")


ISOLATED_UP_TO = 16        # worlds up to this many cards get a worker per card when a fault kills one card


def cards_per_host(world: int, nproc: int, faults: str = "") -> int:
    """How many of a node's cards share one Ray worker (a ``CardHost``, rt/ray/actor.py): all of a node's, since a
    Ray worker costs ~0.3 s of CPU to boot before any card code runs and ~60 MiB — eight of them took 3.4-8.3 s
    from request to serving on this 2-core machine, one host of eight 0.35-1.0 s (docs/performance.md, issue 26).
    Except when the job injects ``kill_card`` (``faults``: its NPUSIM_FAULTS) into a world of at most
    ISOLATED_UP_TO cards: then one worker per card, so the card killed dies alone, as on real hardware.
    ``NPUSIM_CARDS_PER_HOST=k`` overrides (1: a Ray worker per card)."""
    text = os.environ.get("NPUSIM_CARDS_PER_HOST", "").strip()
    if text:
        return args.integer(int(text) if text.isdigit() else text, "launch", "NPUSIM_CARDS_PER_HOST", lo=1, hi=64)
    if "kill_card" in faults and world <= ISOLATED_UP_TO:
        return 1
    return nproc


def simulate_nodes(node: dict, nnodes: int) -> list[dict]:
    """``nnodes`` simulated servers on one Ray node (the embedded session): each its own node index, card set,
    sockets and rank-table server, the same machine underneath; the node's NPUs split evenly among them."""
    return [dict(node, npus=node["npus"] // nnodes) for _ in range(nnodes)]


class RayBackend:
    """Node agents and real card actors; same interface as ``local_backend.LocalBackend``.

    ``--nnodes K`` places the K nodes on K Ray nodes of a cluster (``--address``, or the caller's session); on
    the embedded session it simulates them on this machine (:func:`simulate_nodes`): every node agent runs in
    this process, each node gets its own cards, and a communicator that spans them uses the cross-node
    algorithms and transport exactly as on a cluster."""

    def __init__(self, rc):
        from rt.ray import pool, session  # noqa: I001 - first: it sets what Ray reads at import
        import ray

        self._ray, self._session, self._pool, self._rc = ray, session, pool, rc
        # read (and checked) once, before Ray starts
        self._per_host = cards_per_host(rc.world_size, rc.nproc, rc.env.get("NPUSIM_FAULTS") or "")
        self.agents: list = []    # per node: a NodeAgent here (the launcher's node) or a Ray actor handle
        self._local: set = set()  # indices of the nodes whose agent runs in this process
        self._news = threading.Event()  # set by the in-process agents when they have news for poll()
        self._cards: list = []
        self._pending: dict = {}  # remote agent index -> outstanding poll ref
        self._connected_here = self._started_here = False
        self._agents_ready: list = []
        self._joining: JoinProgress | None = None
        if ray.is_initialized():
            where = "the caller's Ray session"
        elif rc.address:
            session.connect_ray(rc.address)  # AclError naming the address if unreachable
            self._connected_here, where = True, rc.address
        else:
            check_world_fits(rc.nnodes, rc.nproc, self._per_host)
            # The ranks run here (this node's agent is in this process): their fork server imports while Ray starts.
            if os.path.isdir(rc.cwd):
                forkserver.prestart((rc.python, "-u", *rc.program), common_rank_env(rc))
            session.start_local_ray(rc.hw, nodes=rc.nnodes)
            self._started_here, where = True, "the embedded local session"
        # Warm cards only pay off in a session that outlives this job: the caller's (a test fixture, a notebook).
        self._warm = not (self._started_here or self._connected_here)
        try:
            context = ray.get_runtime_context()
            nodes = session.nodes_with_npus()
            if self._started_here and rc.nnodes > 1:
                self.nodes = simulate_nodes(nodes[0], rc.nnodes)
            else:
                self.nodes = place_nodes(nodes, rc.nnodes, rc.nproc, context.get_node_id(), where)
            self.hosts = [n["ip"] for n in self.nodes]
            self.job_env = {"NPUSIM_RAY_ADDRESS": context.gcs_address, **self._session.auth_env()}
            self._create_agents(context.get_node_id())
        except BaseException:
            self.close()
            raise

    def _create_agents(self, local_node_id: str) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        agent_cls = self._ray.remote(NodeAgent)
        for index, node in enumerate(self.nodes):
            if node["node_id"] == local_node_id:
                # Our own node: an agent actor would be one more Ray worker to boot (~0.5 s CPU on a
                # 2-core laptop, competing with the cards) before the first rank could start.
                self.agents.append(NodeAgent(index, notify=self._news.set))
                self._local.add(index)
                continue
            strategy = NodeAffinitySchedulingStrategy(node_id=node["node_id"], soft=False)
            self.agents.append(agent_cls.options(
                num_cpus=0, max_concurrency=8, max_restarts=0, scheduling_strategy=strategy,
                namespace=self._session.NAMESPACE).remote(index))
        # Remote agents boot while the first attempt's cards are created; start() waits for them.
        self._agents_ready = [self.agents[i].ping.remote() for i in self._remote()]

    def _remote(self) -> list[int]:
        """Indices of the nodes whose agent is a Ray actor."""
        return [i for i in range(len(self.agents)) if i not in self._local]

    def _call(self, method: str, *args) -> list:
        """Call method on every agent (Ray ones concurrently, in-process ones directly); results in node order."""
        refs = {i: getattr(self.agents[i], method).remote(*args) for i in self._remote()}
        local = {i: getattr(self.agents[i], method)(*args) for i in sorted(self._local)}
        remote = dict(zip(refs, self._ray.get(list(refs.values())))) if refs else {}
        return [local[i] if i in local else remote[i] for i in range(len(self.agents))]

    def _wait_agents(self) -> None:
        refs, self._agents_ready = self._agents_ready, []
        if not refs:
            return
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=AGENT_START_TIMEOUT)
        if len(ready) < len(refs):
            late = [self.hosts[i] for i, r in zip(self._remote(), refs) if r not in ready]
            raise AclError(AclErrorCode.ACL_ERROR_RT_DEV_SETUP_ERROR,
                           f"launch: node agents on {late} did not start within {AGENT_START_TIMEOUT:.0f} s")
        self._ray.get(refs)

    def new_job_id(self) -> str:
        return self._session.new_job_id()

    def prepare(self, card_job: str) -> list[dict]:
        """Create the card actors of the attempt named ``card_job`` on every node; returns each node's extra rank
        environment."""
        # Cards of every node boot at once and while the ranks start (a rank's rt waits for its card's
        # socket); start() then waits for all of them, so a card that fails still stops the job. In a Ray
        # session that outlives the job the cards are warm ones (rt/ray/pool.py), reset after each job.
        if not self._warm:
            fresh = [self._session.create_cards(card_job, index, node["node_id"], self._rc.hw,
                                                indices=self._rc.devices, wait=False, per_host=self._per_host,
                                                parties=self._rc.world_size)
                     for index, node in enumerate(self.nodes)]
        else:
            fresh = [self._pool.acquire(card_job, index, node["node_id"], self._rc.hw, count=node["npus"], wait=False)
                     for index, node in enumerate(self.nodes)]
        self._cards.extend(fresh)
        self._card_job = card_job
        return [{**self.job_env, "NPUSIM_JOB": card_job, "NPUSIM_CARD_DIR": c.socket_dir} for c in fresh]

    def start(self, specs_per_node: list, attempt: int) -> None:
        for index in sorted(self._local):   # at once: these ranks wait for their cards themselves
            self.agents[index].start(specs_per_node[index], attempt)
        self._wait_agents()
        refs = [self.agents[i].start.remote(specs_per_node[i], attempt) for i in self._remote()]
        if self._rc.world_size > PROGRESS_FROM:      # "ranks joined n/N" while they reach hccl.init's rendezvous
            from hccl.comm import world_board_prefix
            from rt.ray.actor import job_board
            board = job_board(self._session.card_namespace(self._card_job))
            self._joining = JoinProgress(self._ray, board, world_board_prefix(self._card_job), self._rc.world_size)
        self._wait_cards()
        self._ray.get(refs)

    def _wait_cards(self) -> None:
        """Every card of the attempt serving; a large world's boot is reported as it goes ("cards booted n/N")
        and given time in proportion to its size (the cards boot at once, sharing this machine's cores)."""
        total = sum(len(group) for c in self._cards for group in c.pending.values())
        deadline = time.monotonic() + CARD_BOOT_WAIT + CARD_BOOT_EACH * total
        booted, started, said = [0], time.monotonic(), [0.0]

        def progress(n: int) -> None:
            if self._joining is not None:
                self._joining.tick()
            booted[0] += n
            now = time.monotonic()
            if booted[0] == total or now - said[0] >= 2.0:
                said[0] = now
                print(f"npusim: cards booted {booted[0]}/{total} ({now - started:.0f} s)", file=sys.stderr, flush=True)
        for cards in self._cards:
            self._session.wait_cards(cards, timeout=max(0.0, deadline - time.monotonic()),
                                     on_ready=progress if total > PROGRESS_FROM else None)

    def poll(self, timeout: float) -> list[dict]:
        """News from any node agent; keeps one long poll outstanding per remote agent."""
        wait = min(timeout, DRIVER_WAIT)
        if self._joining is not None:
            self._joining.tick()
        self._news.clear()
        results = self._poll_local()
        if not self._remote():
            if not results and self._news.wait(wait):
                results = self._poll_local()
            return results
        ray = self._ray
        for index in self._remote():
            if index not in self._pending:
                self._pending[index] = self.agents[index].poll.remote(AGENT_POLL)
        refs = list(self._pending.values())
        ready, _ = ray.wait(refs, num_returns=1, timeout=0 if results else wait)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for index, ref in list(self._pending.items()):
            if ref not in ready:
                continue
            del self._pending[index]
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as e:
                raise AclError(AclErrorCode.ACL_ERROR_RT_FAILURE,
                               f"launch: the node agent of node {index} ({self.hosts[index]}) died: {e}") from None
            if result["lines"] or result["exits"]:
                results.append(result)
        return results

    def _poll_local(self) -> list[dict]:
        return [r for r in (self.agents[i].poll(0) for i in sorted(self._local)) if r["lines"] or r["exits"]]

    def stop(self, grace: float) -> None:
        """SIGTERM every rank on every node, SIGKILL after grace seconds, wait for all to exit."""
        self._call("terminate")
        self._call("wait_all", grace)
        self._call("kill")
        done = self._call("wait_all", 30.0)
        if not all(done):
            raise AclError(AclErrorCode.ACL_ERROR_RT_FAILURE, "launch: ranks survived SIGKILL for 30 s")

    def release(self) -> None:
        """Destroy this attempt's card actors and their socket directories."""
        cards, self._cards = self._cards, []
        for c in cards:
            if not self._warm:
                self._session.destroy_cards(c)
            else:
                self._pool.release(c)             # reset and kept warm for the next job of this session

    def close(self) -> None:
        """Kill the node agents (their ranks die with them) and leave Ray as we found it."""
        ray = self._ray
        try:
            self.release()
            remote = [self.agents[i] for i in self._remote()]
            if remote:
                ray.wait([a.shutdown.remote() for a in remote], num_returns=len(remote), timeout=30)
            for index in sorted(self._local):
                self.agents[index].shutdown()
            for a in remote:
                ray.kill(a, no_restart=True)
        finally:
            self.agents, self._pending, self._local = [], {}, set()
            if self._connected_here:
                ray.shutdown()  # leaves the cluster running
            elif self._started_here:
                self._session.stop_ray()
            # else: the caller's session (e.g. a test fixture) stays up for its next use


def ray_initialized() -> bool:
    """Whether this process already has a Ray session, without importing Ray if it was never imported."""
    ray = sys.modules.get("ray")
    return bool(ray and ray.is_initialized())
