"""The kernel frame added to stamped spans: the setting, else the GPU model's measured value, else nothing."""

from __future__ import annotations

import pytest

from telemetry.clocks.frame import AUTO, MEASURED_NS, device_name, frame_ns


def test_a_measured_model_gets_its_frame_and_others_none():
    assert frame_ns("NVIDIA H200") == MEASURED_NS["NVIDIA H200"] > 0
    assert frame_ns("NVIDIA H200", AUTO) == MEASURED_NS["NVIDIA H200"]
    assert frame_ns("AMD Instinct MI300X") == 0
    assert frame_ns("") == 0


@pytest.mark.parametrize("setting", [0, 1, 750])
def test_the_setting_wins_over_the_measured_frame(setting):
    assert frame_ns("NVIDIA H200", setting) == setting
    assert frame_ns("some other GPU", setting) == setting


def test_a_runtime_that_cannot_name_its_device_gives_no_name():
    class Broken:
        class cuda:  # noqa: N801 - stands in for torch.cuda
            @staticmethod
            def get_device_name(device):
                raise RuntimeError("no device")

    class Named:
        class cuda:  # noqa: N801
            @staticmethod
            def get_device_name(device):
                return f"GPU of {device}"

    assert device_name(Broken, "cuda:0") == ""
    assert device_name(Named, "cuda:1") == "GPU of cuda:1"
