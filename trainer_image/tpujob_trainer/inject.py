"""Making an injected fault really happen (see `faults` for the specs and `README.md`).

Each branch produces the genuine failure, not a report of one: the kernel delivers a real
SIGKILL, the process really exits, the main thread really blocks (so collectives of peers
block too), and an allocation really fails. The shape fault is applied by the training loop
to its own batch, so the framework raises its own shape error.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import numpy as np

from tpujob_trainer.contract import EXIT_CODES, ExitCode
from tpujob_trainer.failures import TrainerError
from tpujob_trainer.faults import Fault, FaultKind

# Far beyond any host's address space (2**47 bytes of user space on x86-64 and arm64), so the
# allocation fails at once without touching memory the machine needs.
IMPOSSIBLE_HOST_BYTES = 1 << 48
IMPOSSIBLE_DEVICE_ELEMENTS = 1 << 40


def inject(fault: Fault, step: int, backend: str) -> None:
    """Make `fault` happen before `step` runs; returns only for SHAPE (the caller's part)."""
    print(f"tpujob-trainer: injecting fault {fault.kind} before step {step}", flush=True)
    sys.stderr.flush()
    if fault.kind is FaultKind.CRASH:
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.kind is FaultKind.EXIT_CODE:
        code = fault.exit_code or 1
        if code in {int(c) for c in EXIT_CODES}:
            # A contract code comes with its termination message, as the trainer's own would.
            raise TrainerError(ExitCode(code), f"injected fault exit-code={code} at step {step}")
        os._exit(code)
    elif fault.kind is FaultKind.HANG:
        threading.Event().wait()
    elif fault.kind is FaultKind.OOM:
        if backend == "cpu":
            np.empty(IMPOSSIBLE_HOST_BYTES, dtype=np.uint8)
        else:
            import jax.numpy as jnp

            jnp.zeros((IMPOSSIBLE_DEVICE_ELEMENTS,), jnp.float32).block_until_ready()
