"""--device auto|cpu|cuda|all: which devices a run uses, and why a GPU is missing."""

from __future__ import annotations

from dataclasses import dataclass

from precisionlab import native
from precisionlab.errors import NoDeviceError, UsageError

CHOICES = ("auto", "cpu", "cuda", "all")


@dataclass(frozen=True)
class DevicePlan:
    cpu: bool
    cuda: bool
    cuda_unavailable: str  # the reason GPU rows are missing under auto; "" otherwise

    @property
    def names(self) -> list[str]:
        return [d for d, on in (("cpu", self.cpu), ("cuda", self.cuda)) if on]

    def describe(self) -> dict:
        """What a result records of the devices it ran on."""
        return {"cpu": self.cpu, "cuda": self.cuda, "cuda_unavailable": self.cuda_unavailable,
                "gpu_name": gpu_name() if self.cuda else None}


def resolve(choice: str) -> DevicePlan:
    """all: CPU, plus the GPU where one is present (the kernel commands'
    default). cpu/cuda: that one only, a missing GPU an error (exit 3). auto:
    this release still as all in the kernel commands (the command line's alias
    rewrites it to all, with a notice); the model commands read it themselves
    (engines/registry.model_device: the GPU where present, else the CPU)."""
    choice = choice.lower()
    if choice not in CHOICES:
        raise UsageError(f"unknown device {choice!r}; choose from {', '.join(CHOICES)}")
    if choice == "cpu":
        return DevicePlan(True, False, "")
    gpu = native.gpu_status()
    if gpu.count == 0:
        if choice == "cuda":
            raise NoDeviceError(f"--device {choice}: no CUDA GPU available ({gpu.reason})")
        return DevicePlan(True, False, gpu.reason or "no CUDA GPU")
    return DevicePlan(choice != "cuda", True, "")


def gpu_name() -> str | None:
    """The first GPU's name, or None; never raises for a missing GPU."""
    if native.gpu_status().count == 0:
        return None
    return native.device_info(0).name
