"""info: everything that decides the numbers on this machine."""

from __future__ import annotations

import os
import platform

from precisionlab import native
from precisionlab.errors import RunError


def _fmt_cuda(v: int) -> str | None:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else None


def run() -> dict:
    from precisionlab.runtime import machine
    from precisionlab.runtime.torch_flags import torch_flags

    out = {"versions": machine.versions(), "python_implementation": platform.python_implementation(),
           "cpu": {"model": machine.cpu_name(), "threads": os.cpu_count(),
                   "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}}
    try:
        out["library"] = {"path": native.library_path(), "abi": native.ABI_VERSION, "build": native.build_info()}
        gpu = native.gpu_status()
        runtime, driver = native.cuda_versions()
        out["catalog"] = catalog()
    except RunError as e:
        out["library"] = {"error": str(e)}
        gpu, runtime, driver = None, 0, 0
    out["cuda"] = {"runtime": _fmt_cuda(runtime), "driver": _fmt_cuda(driver),
                   "devices": gpu.count if gpu else 0, "unavailable": (gpu.reason if gpu else "no library") or None}
    out["gpus"] = [vars(native.device_info(i)) for i in range(gpu.count)] if gpu and gpu.count else []
    out["flags"] = torch_flags()
    t = _torch_cuda()
    if t:
        out["torch_cuda"] = t
    return out


def catalog() -> dict:
    """What the library implements, from its own tables: every kernel variant,
    every format (bits, precision, exponent range, max, inf/NaN), and the
    block-scaled formats (element, block size, scale format)."""
    from precisionlab.catalog import formats

    fmts = [{"name": f.name, "code": f.code, "bits": f.bits, "precision": f.precision, "emin": f.emin,
             "emax": f.emax, "max": f.max, "has_inf": f.has_inf, "has_nan": f.has_nan,
             "storage_only": f.storage_only} for f in formats.FORMATS.values()]
    blocks = [{"name": b.name, "element": b.element.name, "block": b.block, "scale": b.scale.name,
               "tensor_scale_bits": b.tensor_scale_bits, "bits_per_element": b.bits_per_element}
              for b in native.block_formats().values()]
    return {"variants": [v.to_json() for v in native.catalog()], "formats": fmts, "block_formats": blocks}


def _torch_cuda() -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    return {"version": torch.version.cuda, "available": torch.cuda.is_available(),
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}
