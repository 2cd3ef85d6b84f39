"""Run scripts inside .venv-vllm (the real vLLM 0.33.0) and hand what they observed to the tests.

The main test venv has no vLLM. Each test module names the script it reads (``SCRIPT``); the
scripts of every selected module start together at the first such test (two cores run them
side by side), each as ``python -O -m tests.vllm_real.inside.NAME`` with:

* ``-O``: vLLM's Triton paths assert ``not q.is_cpu``; without asserts they run on CPU tensors;
* ``CUDA_VISIBLE_DEVICES=""``: with no active Triton driver (no GPU) vLLM swaps ``triton`` for a
  placeholder unless that variable is set and empty (vllm/triton_utils/importing.py: its allowance
  for Ray workers), and ``TRITON_INTERPRET=1`` then runs its kernels in Triton's interpreter.

If .venv-vllm cannot be built the tests are skipped with the reason in the summary (``-ra``);
under CI (``CI`` set, as .ci/run sets it) they fail instead: there the venv must build. Every script
reports the ``vllm.__version__`` it imported; one other than the pinned version fails the tests that
read it (:func:`version_problem`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("ROUTESCOPE_VLLM_VENV", ROOT / ".venv-vllm"))
STAMP = VENV / "routescope-stamp"
FAILED = Path(f"{VENV}.failed")
TIMEOUT_S = 900


_CI_OFF = frozenset({"", "0", "false", "no", "off"})


def pinned_vllm(requirements: Path = Path(__file__).with_name("requirements.txt")) -> str:
    """The vLLM version the venv is built with: its ``vllm==X`` line in requirements.txt."""
    for line in requirements.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep and name.strip().lower() == "vllm":
            return version.strip()
    raise LookupError(f"{requirements} pins no vllm==X")


VLLM_VERSION = pinned_vllm()


def when_the_venv_is_missing(env: Mapping[str, str]) -> str:
    """``"fail"`` under CI (``CI`` set to anything but empty/0/false/no/off), else ``"skip"``: the venv
    must build in CI, while on a user's machine (no network, say) a loud skip is the right answer."""
    return "skip" if env.get("CI", "").strip().lower() in _CI_OFF else "fail"


def version_problem(found: object, pinned: str = VLLM_VERSION) -> str | None:
    """Why a script's ``vllm.__version__`` cannot stand for the pinned release; None when it is that release."""
    if found == pinned:
        return None
    return (f"the venv's vllm.__version__ is {found!r}, not {pinned!r} (tests/vllm_real/requirements.txt): "
            f"these tests prove nothing about {pinned}; rebuild the venv (rm -rf {VENV}; bash scripts/vllm_env.sh)")


def _pins_hash() -> str:
    """What scripts/vllm_env.sh writes into its stamp: the pins, pyproject.toml and the script itself."""
    parts = (Path(__file__).with_name("requirements.txt"), ROOT / "pyproject.toml", ROOT / "scripts" / "vllm_env.sh")
    return hashlib.sha256(b"".join(p.read_bytes() for p in parts)).hexdigest()


def _venv_python() -> Path:
    """The venv's python; the venv is built (or brought up to date) first unless it failed for these pins."""
    want = _pins_hash()
    stamp = STAMP.read_text().strip() if STAMP.exists() else ""
    failed = FAILED.read_text().splitlines() if FAILED.exists() else []
    if stamp != want and f"stamp {want}" not in failed[:2]:
        subprocess.run(["bash", str(ROOT / "scripts" / "vllm_env.sh")], cwd=ROOT, timeout=1800, check=False,
                       env={**os.environ, "ROUTESCOPE_VLLM_VENV": str(VENV)})
    if STAMP.exists() and STAMP.read_text().strip() == want:
        return VENV / "bin" / "python"
    why = FAILED.read_text().splitlines()[0] if FAILED.exists() else "scripts/vllm_env.sh left no stamp, no reason"
    message = f"vLLM 0.33.0 NOT TESTED: its venv {VENV} could not be built: {why} (details: {FAILED})"
    if when_the_venv_is_missing(os.environ) == "fail":
        pytest.fail(message)
    pytest.skip(message)


class Script:
    """One script running in the venv; ``result()`` waits for it and reads its JSON."""

    def __init__(self, name: str, python: Path, tmp: Path, env: dict[str, str]) -> None:
        self.name = name
        self.out = tmp / "result.json"
        self.stdout, self.stderr = tmp / "stdout.txt", tmp / "stderr.txt"
        full = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1",
                "VLLM_LOGGING_COLOR": "0", "NO_COLOR": "1", "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
                "ROUTESCOPE_REAL_OUT": str(self.out), "ROUTESCOPE_REAL_TMP": str(tmp)}
        for key in ("ROUTESCOPE_VLLM", "PROMETHEUS_MULTIPROC_DIR", "ROUTESCOPE_TELEMETRY_MULTIPROC_DIR", "VLLM_PLUGINS"):
            full.pop(key, None)
        full.update(env)
        with open(self.stdout, "w") as so, open(self.stderr, "w") as se:
            self.proc = subprocess.Popen([str(python), "-O", "-m", f"tests.vllm_real.inside.{name}"], cwd=ROOT,
                                         env=full, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
        self._result: SimpleNamespace | None = None

    def result(self) -> SimpleNamespace:
        if self._result is None:
            try:
                rc = self.proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
            tail = self.stderr.read_text()[-4000:]
            if rc != 0 or not self.out.exists():
                pytest.fail(f"tests/vllm_real/inside/{self.name}.py exited {rc} in {VENV}:\n{tail}", pytrace=False)
            self._result = SimpleNamespace(data=json.loads(self.out.read_text()), stdout=self.stdout.read_text(),
                                           stderr=self.stderr.read_text())
        problem = version_problem(self._result.data.get("vllm_version"))
        if problem:
            pytest.fail(f"tests/vllm_real/inside/{self.name}.py: {problem}", pytrace=False)
        return self._result


def pytest_collection_modifyitems(session, config, items):
    """Remember which scripts the selected tests read (module attribute ``SCRIPT``): only those start."""
    config._vllm_real_modules = {i.module.SCRIPT: i.module for i in items
                                 if i.module is not None and hasattr(i.module, "SCRIPT") and "vllm_real" in str(i.path)}


@pytest.fixture(scope="session")
def vllm_scripts(request, tmp_path_factory) -> dict[str, Script]:
    """Every selected module's script, started at once; a module's ``prepare(tmp)`` returns extra env."""
    python = _venv_python()
    started = {}
    for name, module in sorted(request.config._vllm_real_modules.items()):
        tmp = tmp_path_factory.mktemp(name)
        prepare = getattr(module, "prepare", None)
        started[name] = Script(name, python, tmp, prepare(tmp) if prepare else {})
    yield started
    for s in started.values():
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


@pytest.fixture(scope="module")
def run(request, vllm_scripts) -> SimpleNamespace:
    """What this module's script observed: ``data`` (its JSON), ``stdout``, ``stderr``."""
    return vllm_scripts[request.module.SCRIPT].result()


def samples(data: list, name: str, **labels: str) -> float:
    """Sum of the exported samples named ``name`` whose labels include ``labels``."""
    return sum(v for n, lab, v in data if n == name and all(lab.get(k) == x for k, x in labels.items()))
