"""``RayCards``: the cards of ``rt.init()`` as actors of a Ray session — an embedded one on 127.0.0.1 that
this process starts (and stops at ``rt.finalize``), or a cluster joined with ``address`` / ``RAY_ADDRESS``.
The cards are created on first use and reached, like a launcher's, over their Unix sockets. Ray registers its
exit hook when the session starts; ``Runtime.init`` registers the runtime's after it, so the cards go first."""

from __future__ import annotations

import os
import shutil
import threading

from ..config import Config
from ..constants import AclErrorCode as E
from ..errors import AclError
from ..host.backends import SocketDirCards
from . import session


class RayCards(SocketDirCards):
    kind = "ray"

    def __init__(self, cfg: Config, visible: list[int], address: str | None):
        if address:
            session.connect_ray(address)
        else:
            session.start_local_ray(cfg)
        import ray
        nodes = session.nodes_with_npus()
        here = ray.get_runtime_context().get_node_id()
        ids = [n["node_id"] for n in nodes]
        if here not in ids:
            raise AclError(E.ACL_ERROR_RT_NO_DEVICE, "this Ray node offers no 'NPU' resource: start it with "
                                                     "ray start --resources='{\"NPU\": 8}'")
        self.node_id = here
        self.visible = list(visible)
        self.job = os.environ.get("NPUSIM_JOB") or ray.get_runtime_context().get_job_id()
        super().__init__(cfg, os.path.join(session.socket_root(), f"ray-{self.job}"), ids.index(here))
        self.cardsets = []
        self._lock = threading.Lock()

    def connect(self, index, on_message, on_close):
        with self._lock:
            if not os.path.exists(self.path(index)):
                # start every visible card of the node at once: actors start in parallel (~2 s for 8),
                # one at a time they cost ~1.5 s each as the program touches them
                wanted = sorted({index, *self.visible})
                missing = [i for i in wanted if not os.path.exists(self.path(i))]
                self.cardsets.append(session.create_cards(self.job, self.node, self.node_id, self.cfg,
                                                          socket_dir=self.dir, indices=missing))
        return super().connect(index, on_message, on_close)

    def close(self) -> None:
        import ray
        created = bool(self.cardsets)
        if ray.is_initialized():               # else Ray already went down (interpreter exit): its actors too
            for cs in self.cardsets:
                session.destroy_cards(cs)
        self.cardsets = []
        if created:             # only the creator removes the job's socket dir: others still use it
            shutil.rmtree(self.dir, ignore_errors=True)
        session.stop_ray()
