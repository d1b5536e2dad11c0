"""The card's execution part: user kernels (shipped by value), built-in kernels, sleeps, offline models."""

from __future__ import annotations

import time

from ..constants import AclErrorCode as E
from ..errors import AclError
from ..kernels import registry
from .queues import annotate


class ExecCommands:
    """The kernel and model commands and tasks of ``card``, in the tables ``commands`` and ``tasks`` (wire name →
    handler, as ``Card.handle`` calls them)."""

    def __init__(self, card):
        self.card = card
        self.user_kernels: dict[str, object] = {}     # name -> a @rt.kernel function its process shipped
        self.commands = {
            "kernel_register": self.c_kernel_register,
            "model_load": self.c_model_load,
            "model_unload": self.c_model_unload,
        }
        self.tasks = {
            "kernel": self.t_kernel,
            "sleep": self.t_sleep,
            "model_execute": self.t_model_execute,
        }

    def c_kernel_register(self, conn, name, blob):
        """A ``@rt.kernel`` function shipped by value (cloudpickle) from the user's own process."""
        import pickle
        fn = pickle.loads(blob)
        if not callable(fn):
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"kernel_register: {name!r} is not callable")
        self.user_kernels[name] = fn

    def t_kernel(self, conn, stream, name, inputs, outputs, attrs):
        ins = [self.card.tensor(t, f"{name} input {i}") for i, t in enumerate(inputs)]
        outs = [self.card.tensor(t, f"{name} output {i}") for i, t in enumerate(outputs)]
        user = self.user_kernels.get(name)
        op = None if user is not None else registry.get_op(name)

        def run():
            annotate(kernel=name)              # named in the task log (flight recorder, timeline)
            if user is not None:
                user(*ins, *outs, **attrs)
            else:
                op.compute(ins, outs, attrs)
        return run

    def t_sleep(self, conn, stream, seconds):
        def run():
            annotate(kernel=f"sleep({seconds:g} s)")
            time.sleep(seconds)
        return run

    def c_model_load(self, conn, data):
        model_id, desc = self.card.models.load(data, conn.id)
        return [model_id, desc]

    def c_model_unload(self, conn, model_id):
        self.card.models.unload(model_id, conn.id)

    def t_model_execute(self, conn, stream, model_id, inputs, outputs, dynamic):
        def run():
            annotate(model=model_id)
            self.card.models.execute(model_id, inputs, outputs, dynamic)
        return run
