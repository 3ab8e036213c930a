"""Device preflight: before the first step, check that the framework got the devices asked for.

`check_devices` is pure: it takes what a `DeviceProbe` saw (the backend, the local device
count, or the error the framework raised when asked for TPUs) and returns the backend or raises
a `TrainerError` whose message says what to check. `probe_jax` is JAX's probe; the TensorFlow
loop builds its probe from its TPU strategy (`tf_trainer`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tpujob_trainer.contract import ExitCode
from tpujob_trainer.failures import TrainerError

log = logging.getLogger(__name__)

_BUSY_MARKS = ("TPU is already in use", "already in use by process", "Device or resource busy")
# libtpu absent altogether: JAX fell back to CPU because the image has no TPU support.
_NOT_INSTALLED_MARKS = ("cannot open shared object file", "No such file or directory")
# libtpu present but refusing to start: typically a jax/libtpu version or TPU generation mismatch.
_LIBTPU_MARKS = (
    "libtpu",
    "TPU initialization failed",
    "Unable to initialize backend 'tpu'",
    "failed to initialize",
)


@dataclass(frozen=True)
class DeviceProbe:
    """What JAX reported: its default backend, local devices, and any TPU backend error."""

    backend: str
    local_devices: int
    device_kinds: tuple[str, ...]
    tpu_error: str | None = None


def probe_jax(expect_tpu: bool) -> DeviceProbe:
    """Ask JAX for its devices; when TPUs are expected, also ask for the TPU backend itself."""
    import jax

    tpu_error: str | None = None
    if expect_tpu:
        try:
            jax.devices("tpu")
        except RuntimeError as error:
            tpu_error = str(error)
    devices = jax.local_devices()
    return DeviceProbe(
        backend=jax.default_backend(),
        local_devices=len(devices),
        device_kinds=tuple(sorted({d.device_kind for d in devices})),
        tpu_error=tpu_error,
    )


def check_devices(
    probe: DeviceProbe, *, expect_chips: int, allow_cpu_fallback: bool, framework: str = "JAX"
) -> str:
    """The backend to train on, or a TrainerError naming what to check."""
    if expect_chips <= 0:
        return probe.backend
    error = probe.tpu_error or ""
    if any(mark in error for mark in _BUSY_MARKS):
        raise TrainerError(
            ExitCode.DEVICE_BUSY,
            f"the TPU is held by another process ({error.splitlines()[0][:300]}); check for a "
            "leftover trainer in this pod or on the node (lsof /dev/accel* / /dev/vfio) and that "
            "only one container per pod requests google.com/tpu",
        )
    not_installed = any(mark in error for mark in _NOT_INSTALLED_MARKS)
    if probe.backend != "tpu" and not not_installed and any(m in error for m in _LIBTPU_MARKS):
        raise TrainerError(
            ExitCode.LIBTPU_UNAVAILABLE,
            f"libtpu could not be loaded ({error.splitlines()[0][:300]}); check that the image "
            "installs jax[tpu] with a libtpu matching the jax/jaxlib version and the TPU "
            "generation of the node",
        )
    if probe.backend != "tpu":
        if allow_cpu_fallback:
            log.warning(
                "expected %d TPU chips per host but %s uses %s; continuing because CPU fallback "
                "is allowed",
                expect_chips,
                framework,
                probe.backend,
            )
            return probe.backend
        raise TrainerError(
            ExitCode.DEVICE_FALLBACK_TO_CPU,
            f"expected {expect_chips} TPU chips per host but {framework} fell back to "
            f"{probe.backend}"
            f"{' (libtpu is not installed)' if not_installed else ''}; "
            "check that the pod requests google.com/tpu on a TPU node pool, that the TPU device "
            "plugin runs there, and that jax[tpu]/libtpu are installed in the image "
            "(set allowCpuFallback to train on CPU anyway)",
        )
    if probe.local_devices < expect_chips:
        raise TrainerError(
            ExitCode.DEVICE_COUNT_MISMATCH,
            f"expected {expect_chips} TPU chips per host but {framework} sees "
            f"{probe.local_devices} "
            f"({', '.join(probe.device_kinds)}); check the pod's google.com/tpu request, the "
            "node's TPU topology labels and the device plugin's health",
        )
    return probe.backend
