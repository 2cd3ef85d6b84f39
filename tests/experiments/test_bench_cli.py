"""`routescope bench experiment` refuses a bad option before any work: a usage error naming the option, exit 2,
no traceback (a bad --device reached torch.device and ended in a RuntimeError's traceback)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from routescope.cli import build_app


@pytest.mark.parametrize(("args", "said"), [
    (["--device", "tpu"], "Invalid value for --device: 'tpu': cuda or cpu"),
    (["--fractions", "x"], "Invalid value for --fractions: 'x': expected numbers like 0.01,0.05"),
    (["--thin", "0"], "Invalid value for --thin: 0: one in at least 1"),
    *([(["--device", "cuda"], "Invalid value for --device: cuda: no CUDA/ROCm device is visible to torch")]
      if not torch.cuda.is_available() else []),
])
def test_a_bad_option_is_a_usage_error_before_any_work(args, said):
    res = CliRunner().invoke(build_app(), ["bench", "experiment", *args], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and (res.exception is None or isinstance(res.exception, SystemExit)), res.output
    assert said in " ".join(res.output.replace("│", " ").split()) and "Traceback" not in res.output
