"""Entry point of `tpujob-trainer`: config, the chosen training loop, and the exit contract.

Every way out of a run ends here. OK exits 0. PREEMPTED writes its termination message and
exits 42 through the normal interpreter shutdown, which lets JAX's distributed shutdown barrier
run (all processes stop together). Any exception is described on stderr and in the
termination message and the process leaves with `os._exit`, because a peer may be dead and
JAX's shutdown barrier would otherwise wait for it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tpujob_trainer import rejoin, runtime
from tpujob_trainer.config import Framework, TrainerConfig, load_config
from tpujob_trainer.contract import NO_REJOIN_FLAG, ExitCode
from tpujob_trainer.failures import (
    FailureContext,
    build_message,
    report_exception,
    write_termination_message,
)

if TYPE_CHECKING:
    # Imported when run: each loop pulls in its framework, and a run needs only one.
    from tpujob_trainer.tf_trainer import TensorFlowTrainer
    from tpujob_trainer.trainer import Trainer


def _run(config: TrainerConfig, holder: list[FailureContext]) -> ExitCode:
    trainer: Trainer | TensorFlowTrainer
    # Before the framework's import, which alone can take tens of seconds on a busy host.
    runtime.announce(config)
    if config.framework is Framework.TENSORFLOW:
        from tpujob_trainer.tf_trainer import TensorFlowTrainer

        trainer = TensorFlowTrainer(config)
    else:
        from tpujob_trainer.trainer import Trainer

        trainer = Trainer(config)
    try:
        return trainer.run()
    finally:
        holder.append(trainer.context)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the trainer and exit with the failure contract's code."""
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Our own progress at INFO; orbax and absl log every save step at INFO, which would bury
    # the step lines the operator reads from the log tail.
    logging.getLogger("tpujob_trainer").setLevel(logging.INFO)
    args = list(sys.argv[1:] if argv is None else argv)
    if rejoin.wanted(os.environ) and NO_REJOIN_FLAG not in args:
        # The pod can be kept when another slice is replaced: this process only supervises.
        sys.exit(rejoin.supervise([sys.executable, "-m", "tpujob_trainer", *args], os.environ))
    holder: list[FailureContext] = []
    try:
        config = load_config(args, os.environ)
        holder.append(FailureContext(worker=config.process_id))
        code = _run(config, holder)
    except (Exception, KeyboardInterrupt) as error:
        code = report_exception(error, holder[-1] if holder else FailureContext())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    if code is ExitCode.PREEMPTED:
        context = holder[-1]
        saved = context.checkpoint_step
        summary = (
            f"stopped by SIGTERM after saving step {saved}"
            if saved is not None
            else "stopped by SIGTERM; no checkpoint was saved"
        )
        write_termination_message(build_message(code, summary, context))
    sys.exit(int(code))


if __name__ == "__main__":
    main()
