"""What hardware and AITER are here, detected as vLLM does, or a what-if platform built by hand."""

from __future__ import annotations

import importlib
import os
import platform as _pyplatform
from collections.abc import Mapping
from dataclasses import dataclass, replace

KNOWN_ARCHS = ("gfx942", "gfx950", "gfx90a", "gfx1100", "sm80", "sm89", "sm90", "sm100", "cpu")
VENDORS = ("rocm", "cuda", "cpu")

_TRUE = {"1", "true", "yes", "on"}


def _env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() in _TRUE


@dataclass(frozen=True, slots=True)
class AiterStatus:
    """Whether `import aiter` works here, and why not when it does not."""

    importable: bool
    reason: str
    version: str | None = None


def probe_aiter(module: str = "aiter") -> AiterStatus:
    """Try the import once; without ROCm aiter raises RuntimeError, not ImportError, so catch both."""
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        return AiterStatus(False, f"not installed ({exc.__class__.__name__}: {exc})")
    except Exception as exc:  # noqa: BLE001 - aiter raises RuntimeError("ROCm version file not found")
        return AiterStatus(False, f"import failed ({exc.__class__.__name__}: {exc})")
    return AiterStatus(True, "importable", getattr(mod, "__version__", None))


@dataclass(frozen=True, slots=True)
class Platform:
    """The facts the routing policy looks at; detected, or written by hand for what-if use.

    ``opus_importable`` is None until a gfx950 call first tries the OPUS symbol: the policy
    assumes it is there and the dispatcher re-decides with False when the import fails.
    """

    vendor: str = "cpu"
    arch: str = "cpu"
    device_name: str = ""
    aiter_enabled: bool = False  # VLLM_ROCM_USE_AITER
    aiter_mla_enabled: bool = True  # VLLM_ROCM_USE_AITER_MLA
    aiter: AiterStatus | None = None  # None: not probed (imports are lazy)
    opus_importable: bool | None = None
    what_if: bool = False

    def __post_init__(self) -> None:
        if self.vendor not in VENDORS:
            raise ValueError(f"vendor must be one of {', '.join(VENDORS)}; got {self.vendor!r}")
        if not self.arch or not self.arch.replace("_", "").isalnum():
            raise ValueError(f"arch must look like gfx942 or sm90; got {self.arch!r}")

    @property
    def is_gfx942(self) -> bool:
        return "gfx942" in self.arch

    @property
    def is_gfx950(self) -> bool:
        return "gfx950" in self.arch

    def with_aiter_status(self, status: AiterStatus) -> Platform:
        return replace(self, aiter=status)

    def to_dict(self) -> dict:
        aiter = self.aiter
        return {
            "vendor": self.vendor,
            "arch": self.arch,
            "device_name": self.device_name,
            "what_if": self.what_if,
            "aiter_enabled": self.aiter_enabled,
            "aiter_mla_enabled": self.aiter_mla_enabled,
            "aiter_importable": None if aiter is None else aiter.importable,
            "aiter_reason": "not probed yet" if aiter is None else aiter.reason,
            "aiter_version": None if aiter is None else aiter.version,
        }


def what_if(
    arch: str,
    *,
    aiter: bool = True,
    aiter_mla: bool = True,
    vendor: str | None = None,
) -> Platform:
    """A platform for dry runs: any arch, AITER switched as asked, nothing imported."""
    arch = arch.strip().lower()
    if vendor is None:
        vendor = "rocm" if arch.startswith("gfx") else "cuda" if arch.startswith("sm") else "cpu"
    return Platform(
        vendor=vendor,
        arch=arch,
        device_name=f"what-if {arch}",
        aiter_enabled=aiter and vendor == "rocm",
        aiter_mla_enabled=aiter_mla,
        what_if=True,
    )


def _arch_of(props: object, is_hip: bool) -> str:
    if is_hip:
        # vLLM: `"gfx942" in torch.cuda.get_device_properties().gcnArchName`
        gcn = str(getattr(props, "gcnArchName", "") or "")
        return gcn.split(":")[0] or "gfx-unknown"
    return f"sm{props.major}{props.minor}"  # type: ignore[attr-defined]


def detect(env: Mapping[str, str] | None = None, *, device_index: int = 0) -> Platform:
    """Look at torch's view of the device; read the AITER switches from ``env`` (os.environ)."""
    import torch

    env = os.environ if env is None else env
    aiter_on = _env_flag(env, "VLLM_ROCM_USE_AITER", False)
    mla_on = _env_flag(env, "VLLM_ROCM_USE_AITER_MLA", True)
    if not torch.cuda.is_available():
        return Platform(
            vendor="cpu",
            arch="cpu",
            device_name=_pyplatform.processor() or _pyplatform.machine() or "cpu",
            aiter_enabled=False,
            aiter_mla_enabled=mla_on,
        )
    is_hip = torch.version.hip is not None
    props = torch.cuda.get_device_properties(device_index)
    return Platform(
        vendor="rocm" if is_hip else "cuda",
        arch=_arch_of(props, is_hip),
        device_name=str(getattr(props, "name", "")),
        aiter_enabled=aiter_on and is_hip,
        aiter_mla_enabled=mla_on,
    )
