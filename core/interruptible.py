"""Long native calls that a signal can still stop.

Python runs a signal handler only in the main thread, between bytecodes: while the main thread sits in one LAPACK
call (an eigen-solve of an 8,192-wide group takes minutes on two cores), Ctrl-C and SIGTERM wait for it to return.
`interruptible` runs such a call in a helper thread and waits for it in short slices, so the handlers run at once:
the run stops within a fraction of a second, its finished cells kept, and the abandoned call's result is never
used (the helper is a daemon thread; the process may exit while it is still inside the library).
"""

from __future__ import annotations

import threading

WAIT_SLICE_S = 0.1  # how long the main thread waits between chances for a handler to run


def interruptible(fn, *args, **kwargs):
    """fn(*args, **kwargs), run so that a signal reaches the main thread while fn runs; its exception is raised
    here. Outside the main thread (no handler could run there anyway) it is a plain call."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    import torch

    # torch's grad mode and OpenMP's thread count are per thread: the helper runs with the caller's (a new thread
    # would otherwise take OpenMP's default, every core, and oversubscribe a caller limited to fewer)
    grad, threads = torch.is_grad_enabled(), torch.get_num_threads()
    box: dict = {}

    def target():
        try:
            torch.set_num_threads(threads)
            with torch.set_grad_enabled(grad):
                box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller as it is
            box["error"] = e

    helper = threading.Thread(target=target, daemon=True, name="acbench-solve")
    helper.start()
    while helper.is_alive():
        helper.join(WAIT_SLICE_S)
    if "error" in box:
        raise box["error"]
    return box["value"]
