"""Every acl.* function called with hostile arguments: each returns its code (or its bare default), none
raises, none crashes, none hangs. Prints one line per function kind and a summary.

    python hostile.py
"""
import inspect
import itertools
import sys

import numpy as np

import acl

INTERNAL = 500000                                          # ACL_ERROR_INTERNAL_ERROR
HOSTILE = [None, -1, 0, 2 ** 70, 1.5, "x", b"", [], {"dims": "x"}, object(), np.int64(-7), True]
RAISES_AS_PYACL = {"util.bytes_to_ptr", "util.numpy_to_ptr", "util.numpy_contiguous_to_ptr"}   # ValueError, as pyACL
SKIP = {"finalize", "init", "rt.reset_device_force", "rt.process_report", "util.stop_thread"}  # checked elsewhere


def functions():
    for prefix, module in (("", acl), ("rt.", acl.rt), ("mdl.", acl.mdl), ("util.", acl.util), ("media.", acl.media)):
        for name in sorted(dir(module)):
            fn = getattr(module, name)
            if name.startswith("_") or not callable(fn) or inspect.ismodule(fn) or inspect.isclass(fn):
                continue
            yield prefix + name, fn


def arity(fn):
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len([p for p in params if p.default is p.empty]), len(params)


def well_formed(result):
    if isinstance(result, tuple):
        return len(result) >= 2 and isinstance(result[-1], int)
    return True                                            # a code, or a getter's bare default


def main():
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    ctx, ret = acl.rt.create_context(0)
    assert ret == 0
    calls = codes = 0
    escapes = []
    for name, fn in functions():
        if name in SKIP:
            continue
        required, total = arity(fn)
        n = max(required, 1) if total else 0
        if n == 0:
            continue
        combos = itertools.product(HOSTILE, repeat=n) if n <= 2 else (
            [h] * n for h in HOSTILE)                       # every value in every slot for small arities
        for args in combos:
            calls += 1
            try:
                result = fn(*args)
            except ValueError:
                if name in RAISES_AS_PYACL:
                    continue
                escapes.append((name, args, sys.exc_info()[1]))
                continue
            except Exception as e:                          # noqa: BLE001
                escapes.append((name, args, e))
                continue
            if not well_formed(result):
                escapes.append((name, args, f"malformed result {result!r}"))
            ret = result[-1] if isinstance(result, tuple) else result
            message = acl.get_recent_err_msg() or ""
            if ret == INTERNAL or "internal error in npusim" in message:    # a Python error inside npusim: a bug
                escapes.append((name, args, message.splitlines()[0]))
            elif isinstance(ret, int) and ret != 0:
                codes += 1
    for name, args, e in escapes[:40]:
        print(f"ESCAPE {name}{args!r}: {type(e).__name__}: {e}")
    assert acl.rt.synchronize_device() == 0, acl.get_recent_err_msg()
    assert acl.rt.destroy_context(ctx) == 0
    assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
    print(f"{calls} hostile calls, {codes} returned an error code, {len(escapes)} escaped")
    sys.exit(1 if escapes else 0)


if __name__ == "__main__":
    main()
