"""Options shared by every command, declared once (Annotated typer options),
and the help texts that list what the library's catalog declares."""

from __future__ import annotations

import math
from typing import Annotated, Optional

import typer

from precisionlab.engines import registry as _registry
from precisionlab.errors import PrecisionLabError, UsageError


def variant_names(op: str, device: str | None = None, kinds: tuple[str, ...] = ("algorithm", "kernel", "bug"),
           default: bool | None = None) -> str:
    """The op's variant names from the library's catalog, for help text: the
    help lists what the library implements, never a copy of it. Raises
    PrecisionLabError without the library (see catalog_help)."""
    from precisionlab import native

    return ", ".join(v.name for v in native.variants(op, device) if v.kind in kinds
                     and (default is None or v.default == default))


def catalog_help(build, what: str) -> str:
    """build() (help text naming the catalog's variants), or, without the
    library, one line saying where the names come from: --help and --version
    still work."""
    try:
        return build()
    except PrecisionLabError:
        return f"Comma list of {what} (the library's catalog names them: build it with `make lib`)."


def format_names(subset, sep: str = ", ") -> str:
    """A subset of the format catalog (precisionlab.catalog.formats: ALL,
    COMPUTE, ...), for help text: the help lists what the options take, never
    a copy of it. The subsets are plain names: no library, no torch."""
    return sep.join(subset)


def block_format_names() -> str:
    try:
        from precisionlab import native

        return ", ".join(native.block_formats())
    except PrecisionLabError:
        return "(the library's block formats: build it with `make lib`)"


# Options every command shares.
DeviceOpt = Annotated[str, typer.Option("--device", help="all (the CPU, plus the GPU where present) | cpu | cuda. "
                                        "auto, the old spelling of all here, still works this release.")]
SEED_MAX = 2**64 - 1  # the kernels take the seed as a uint64


def seed_in_range(value: int) -> int:
    if not 0 <= value <= SEED_MAX:
        raise typer.BadParameter(f"must be in 0 ... 2^64-1 ({SEED_MAX}), got {value}")
    return value


SeedOpt = Annotated[int, typer.Option("--seed", callback=seed_in_range,
                                      help="Seed for every random draw, passed down to the kernels (0 ... 2^64-1).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One strict JSON document on stdout (non-finite as strings).")]
# compare tensors and compare model --layers: a compact table by default (name, status, the errors, ratio,
# scale, rule: it fits 80 to 120 columns); every column of each row behind --wide.
WideOpt = Annotated[bool, typer.Option("--wide", help="Every column of each row (default: a compact table of "
                                       "name, status, errors, ratio, scale and the rule that fired; --json has "
                                       "every field).")]
# One option for the pair torch.testing takes both-or-neither (the old --rtol/--atol fold into it, cli/aliases.py).
TolOpt = Annotated[Optional[str], typer.Option("--tol", metavar="RTOL,ATOL", help="Relative and absolute tolerance, "
                                               "both (default: torch.testing's for the dtype).")]


def parse_tol(text: str | None) -> tuple[float | None, float | None]:
    """--tol RTOL,ATOL -> (rtol, atol), (None, None) when not given: each
    finite and >= 0 (NaN would pass every comparison), as
    numerics.compare.check_override asks of a pair given by other means."""
    if text is None:
        return None, None
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        rtol, atol = (float(p) for p in parts)
    except ValueError:
        raise UsageError(f"--tol takes RTOL,ATOL, two numbers (got {text!r})") from None
    for name, v in (("RTOL", rtol), ("ATOL", atol)):
        if not (math.isfinite(v) and v >= 0):
            raise UsageError(f"--tol: {name} must be a finite number >= 0 (got {v})")
    return rtol, atol
# The model commands (compare model, its --metrics and --layers, kvcache): an
# engine spec, checked by engines/registry.py before anything slow starts.
ModelOpt = Annotated[str, typer.Option("--model", help=_registry.spec_help())]


def check_model(spec: str) -> str:
    """--model: non-empty, its engine known and its argument openable (exit 2), before torch is imported."""
    from precisionlab.io import inputs

    inputs.check_given(spec, "--model")
    _registry.resolve(spec)
    return spec


ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", help="CPU threads for torch work, at most 4 per "
                                                   "core (default: sized for the work, one for small matrices).")]


# The accumulator models (numerics/accumulators.py), one option for every
# matmul path: tf32, formats' block-scaled matmul, compare op matmul, router's
# gate GEMM, attention's Q.K^T and P.V. Each command says what the models do
# there (`role`); the spellings are the same everywhere, parsed by
# accumulators.parse (the old --acc-bits and --acc-rounding fold into them,
# cli/aliases.py), so the help that lists them is written here alone.
def accumulator_option(role: str, option: str = "--accumulator", many: bool = True):
    """`option` MODEL[,MODEL...] (one MODEL where not `many`) with the command's
    `role` in its help; the spellings are the library's published kinds
    (numerics.accumulators.spellings_help)."""
    from precisionlab.numerics import accumulators

    what = "Accumulator models MODEL[,MODEL...]" if many else "Accumulator model MODEL"
    return Annotated[Optional[str], typer.Option(option, help=f"{what}: {accumulators.spellings_help()}. {role}")]


def force_option(what: str):
    """--force, declared once: `what` it lets the run replace (files the run names itself, a non-empty
    folder); without it those are refused (io/outputs)."""
    return Annotated[bool, typer.Option("--force", help=f"Replace {what}.")]


def plot_option(what: str):
    """--plot FILE, declared once: `what` the command draws; the file's
    suffix picks the image format, checked before the run, written atomically."""
    return Annotated[Optional[str], typer.Option("--plot", help=f"Draw {what} to this file (.png, .svg, .pdf, ...).")]
