"""The card's execution commands: user kernels (shipped by value), built-in kernels, sleeps, models."""

from __future__ import annotations

import time

from ..constants import AclErrorCode as E
from ..errors import AclError
from ..kernels import registry
from .queues import annotate


class ExecCommands:
    """``c_*`` / ``t_*`` handlers of ``Card`` for kernels and offline models (a mixin)."""

    def c_kernel_register(self, conn, name, blob):
        """A ``@rt.kernel`` function shipped by value (cloudpickle) from the user's own process."""
        import pickle
        fn = pickle.loads(blob)
        if not callable(fn):
            raise AclError(E.ACL_ERROR_INVALID_PARAM, f"kernel_register: {name!r} is not callable")
        self.user_kernels[name] = fn

    def t_kernel(self, conn, stream, name, inputs, outputs, attrs):
        ins = [self._tensor(t, f"{name} input {i}") for i, t in enumerate(inputs)]
        outs = [self._tensor(t, f"{name} output {i}") for i, t in enumerate(outputs)]
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
        model_id, desc = self.models.load(data, conn.id)
        return [model_id, desc]

    def c_model_unload(self, conn, model_id):
        self.models.unload(model_id, conn.id)

    def t_model_execute(self, conn, stream, model_id, inputs, outputs, dynamic):
        def run():
            annotate(model=model_id)
            self.models.execute(model_id, inputs, outputs, dynamic)
        return run
