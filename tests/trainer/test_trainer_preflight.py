"""The device preflight's verdicts for what JAX reports."""

from __future__ import annotations

import pytest

from tpujob_trainer.contract import ExitCode
from tpujob_trainer.failures import TrainerError
from tpujob_trainer.preflight import DeviceProbe, check_devices

pytestmark = pytest.mark.trainer

CPU = DeviceProbe(
    "cpu",
    1,
    ("cpu",),
    "Unknown backend: 'tpu' requested, but no platforms that "
    "are instances of tpu are present. Platforms present are: cpu",
)
TPU4 = DeviceProbe("tpu", 4, ("TPU v5 lite",))


@pytest.mark.parametrize(
    ("probe", "expect", "allow", "expected"),
    [
        (CPU, 0, False, "cpu"),
        (CPU, 4, True, "cpu"),
        (TPU4, 4, False, "tpu"),
        (CPU, 4, False, ExitCode.DEVICE_FALLBACK_TO_CPU),
        (
            DeviceProbe(
                "cpu",
                1,
                ("cpu",),
                "Backend 'tpu' failed to initialize: INTERNAL: Failed "
                "to open libtpu.so: libtpu.so: cannot open shared object file: No such file "
                "or directory.",
            ),
            4,
            False,
            ExitCode.DEVICE_FALLBACK_TO_CPU,
        ),
        (
            DeviceProbe(
                "cpu",
                1,
                ("cpu",),
                "Backend 'tpu' failed to initialize: INTERNAL: TPU "
                "initialization failed: incompatible libtpu",
            ),
            4,
            False,
            ExitCode.LIBTPU_UNAVAILABLE,
        ),
        (
            DeviceProbe(
                "cpu",
                1,
                ("cpu",),
                "TPU initialization failed: The TPU is already in use by process with pid 41",
            ),
            4,
            True,
            ExitCode.DEVICE_BUSY,
        ),
        (DeviceProbe("tpu", 2, ("TPU v5 lite",)), 4, False, ExitCode.DEVICE_COUNT_MISMATCH),
    ],
    ids=[
        "no-tpu-asked",
        "fallback-allowed",
        "tpus-present",
        "fell-back-to-cpu",
        "libtpu-not-installed-is-a-fallback",
        "libtpu-does-not-load",
        "device-busy-even-with-fallback",
        "too-few-chips",
    ],
)
def test_preflight_verdicts(
    probe: DeviceProbe, expect: int, allow: bool, expected: str | ExitCode
) -> None:
    if isinstance(expected, str):
        assert check_devices(probe, expect_chips=expect, allow_cpu_fallback=allow) == expected
        return
    with pytest.raises(TrainerError) as caught:
        check_devices(probe, expect_chips=expect, allow_cpu_fallback=allow)
    assert caught.value.exit_code is expected
    assert "check" in caught.value.summary
