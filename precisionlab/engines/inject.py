"""`--inject SPEC`: one deliberate perturbation of a low-precision run, for
demonstrations and tests of the tool's own detectors.

One syntax for every kind, declared here once:

    TARGET:KEY=VALUE[,KEY=VALUE...]

TARGET is a module name in the model's own naming (`layers.2.mlp`,
`model.layers.1.input_layernorm`) or the word `logits`; the keys say what is
done there. The commands that accept `--inject` say which kinds they apply
and refuse the rest (exit 2), so a typo never runs a clean experiment that
looks like a perturbed one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from precisionlab.catalog import formats
from precisionlab.errors import UsageError

# key -> (value parser, meaning). A kind is the set of keys a spec carries;
# rope's value is a format of ROPE_DTYPES, by any of its names.
ROPE_DTYPES = formats.LOW_COMPUTE
KINDS: dict[str, tuple[type, str]] = {
    "scale": (float, "multiply the module's output by VALUE (a planted bug)"),
    "eps": (float, "run the module's RMSNorm/LayerNorm with this epsilon"),
    "rope": (str, f"compute the RoPE phases in this dtype ({' | '.join(ROPE_DTYPES)}), the long-position pitfall"),
    "noise": (float, "add seeded Gaussian noise of standard deviation VALUE (logits only)"),
}

_TARGET = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Injection:
    target: str
    params: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.target}:" + ",".join(f"{k}={v}" for k, v in self.params.items())


def parse(spec: str) -> Injection:
    """'layers.2.mlp:scale=1.01' -> Injection('layers.2.mlp', {'scale': 1.01})."""
    target, sep, rest = spec.partition(":")
    target = target.strip()
    if not sep or not target or not rest.strip():
        raise UsageError(f"--inject needs TARGET:KEY=VALUE, got {spec!r}")
    if not _TARGET.match(target):
        raise UsageError(f"--inject: bad target {target!r} (letters, digits, '_', '-', '.')")
    params: dict = {}
    for item in rest.split(","):
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or key not in KINDS:
            raise UsageError(f"--inject: unknown key in {item.strip()!r}; keys: {', '.join(KINDS)}")
        if key in params:
            raise UsageError(f"--inject: {key} given twice in {spec!r}")
        kind, _ = KINDS[key]
        if kind is float:
            try:
                v = float(value)
            except ValueError:
                raise UsageError(f"--inject: {key} needs a number, got {value!r}") from None
            if not math.isfinite(v) or (key in ("eps", "noise") and v < 0):
                raise UsageError(f"--inject: {key}={value} is out of range")
            params[key] = v
        else:
            if not value:
                raise UsageError(f"--inject: {key} needs a value")
            params[key] = formats.parse_one(value, ROPE_DTYPES, "--inject rope") if key == "rope" else value
    return Injection(target, params)


def parse_all(specs: list[str] | None, allowed: set[str]) -> list[Injection]:
    """Every spec, checked against the keys this command can apply."""
    out = [parse(s) for s in specs or []]
    for inj in out:
        bad = set(inj.params) - allowed
        if bad:
            raise UsageError(f"--inject: {', '.join(sorted(bad))} is not applied here; this command takes "
                             f"{', '.join(sorted(allowed))}")
    return out
