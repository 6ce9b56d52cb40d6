"""The old spellings of this release, kept working one release more: the
command line is rewritten to the new spelling before typer parses it, with one
notice line on stderr per old spelling used (app._run calls `rewrite`).

ALIASES is the one table: each entry says what it rewrites, to what, and an
example command line the tests run both ways (tests/test_aliases.py)."""

from __future__ import annotations

from dataclasses import dataclass

from precisionlab.errors import UsageError


@dataclass(frozen=True)
class Alias:
    command: tuple[str, ...]   # the command the old spelling belongs to (argv's first words)
    old: str                   # the old option, as the notice quotes it
    new: str                   # what it is now, as the notice quotes it
    kind: str                  # "verb": the option picks a verb; "option": an option renamed; "value": a value;
    #                            "fold": old options folded into one new one (_FOLDS says how)
    verb: tuple[str, ...] = ()  # kind "verb": the new command's words
    drop: bool = False         # kind "verb": the option only chose the mode and goes
    renamed: str = ""          # kind "option": the new option; kind "value": the option whose value it is;
    #                            kind "fold": the old options it folds, comma-separated
    value: tuple[str, str] = ("", "")  # kind "value": (old value, new value)
    example: tuple[str, ...] = ()      # arguments after the command for the test run (cheap)


_MODEL = ("compare", "model")
# In the order they are tried: --layers/--dump first (with them --engine and --reference are the layers pair's).
ALIASES: tuple[Alias, ...] = (
    Alias(_MODEL, "compare model --metrics", "compare metrics", "verb", ("compare", "metrics"), drop=True,
          example=("--metrics", "--tokens", "16", "--dtypes", "bf16")),
    Alias(_MODEL, "compare model --layers", "compare layers", "verb", ("compare", "layers"), drop=True,
          example=("--layers", "--steps", "2", "--dtypes", "bf16")),
    Alias(_MODEL, "compare model --dump", "compare layers --dump", "verb", ("compare", "layers"),
          example=("--dump", "{tmp}/dump", "--steps", "1", "--dtypes", "bf16")),
    Alias(_MODEL, "compare model --contracts", "compare contracts", "verb", ("compare", "contracts"), drop=True,
          example=("--contracts", "--steps", "2", "--batches", "3", "--dtypes", "fp32")),
    Alias(_MODEL, "compare model --trainer/--rollout", "compare rollout", "verb", ("compare", "rollout"),
          example=("--trainer", "embedded", "--rollout", "embedded", "--samples", "1", "--tokens", "4")),
    Alias(_MODEL, "compare model --engine/--reference", "compare engine", "verb", ("compare", "engine"),
          example=("--engine", "embedded", "--tokens", "16", "--steps", "2")),
    Alias(("compare", "layers"), "compare layers --reference/--engine",
          "compare engine-layers --engine YOURS --reference REF", "verb", ("compare", "engine-layers"),
          example=("--reference", "embedded", "--steps", "2", "--dtypes", "bf16")),
    Alias(("nondeterminism",), "nondeterminism --endpoint URL", "nondeterminism endpoint URL", "verb",
          ("nondeterminism", "endpoint"), drop=True, example=("--endpoint", "http://127.0.0.1:9", "--requests", "0")),
    Alias(("softmax",), "softmax --dtype", "softmax --dtypes", "option", renamed="--dtypes",
          example=("--dtype", "bf16", "--values", "1,2,3", "--device", "cpu")),
    Alias(("compare", "op"), "compare op --dtype", "compare op --dtypes", "option", renamed="--dtypes",
          example=("softmax", "--dtype", "bf16", "--shape", "4x64", "--cases", "random", "--device", "cpu")),
    Alias(("accumulate",), "accumulate --accumulators", "accumulate --acc-dtypes", "option", renamed="--acc-dtypes",
          example=("--accumulators", "fp32", "--n", "100", "--device", "cpu")),
    Alias(("compare", "op"), "compare op --rtol/--atol", "compare op --tol RTOL,ATOL", "fold",
          renamed="--rtol,--atol",
          example=("softmax", "--rtol", "0.01", "--atol", "0.001", "--shape", "4x64", "--cases", "random",
                   "--dtypes", "bf16", "--device", "cpu")),
    Alias(("compare", "tensors"), "compare tensors --rtol/--atol", "compare tensors --tol RTOL,ATOL", "fold",
          renamed="--rtol,--atol", example=("{tmp}/a.npz", "{tmp}/b.npz", "--rtol", "0.01", "--atol", "0")),
    Alias(("compare", "tensors"), "compare tensors --a-dtype/--b-dtype/--c-dtype", "compare tensors --dtypes A,B[,C]",
          "fold", renamed="--a-dtype,--b-dtype,--c-dtype",
          example=("{tmp}/a.npz", "{tmp}/b.npz", "--b-dtype", "bf16")),
    Alias(("compare", "contracts"), "compare contracts --draft-tokens FILE", "compare contracts --draft tokens:FILE",
          "fold", renamed="--draft-tokens", example=("--draft-tokens", "{tmp}/none.txt", "--steps", "2")),
    *(Alias(command, f"{' '.join(command)} --acc-bits/--acc-rounding",
            f"{' '.join(command)} --accumulator MODEL:bits=B:rounding=R", "fold", renamed="--acc-bits,--acc-rounding",
            example=example) for command, example in (
        (("tf32",), ("--accumulator", "hopper-fp8", "--acc-bits", "10", "--k", "64")),
        (("formats",), ("--accumulator", "hopper-fp8", "--acc-rounding", "rne", "--shape", "8x64x8", "--device",
                        "cpu", "--no-baselines")),
        (("compare", "op"), ("matmul", "--accumulator", "hopper-fp8", "--acc-bits", "12", "--shape", "4x64x4",
                             "--cases", "random", "--device", "cpu")))),
)
# The mode flags of the old compare model: flags (no value) in the old spelling.
_OLD_FLAGS = {"--metrics", "--layers", "--contracts"}
# What triggers each verb alias besides its own option (compare model --rollout without --trainer).
_TRIGGERS = {"compare model --trainer/--rollout": ("--trainer", "--rollout"),
             "compare model --engine/--reference": ("--engine", "--reference"),
             "compare model --dump": ("--dump",), "nondeterminism --endpoint URL": ("--endpoint",),
             "compare layers --reference/--engine": ("--reference", "--engine")}
# --device auto of the kernel commands (those whose --device defaults to all): now spelled all.
DEVICE_AUTO = Alias((), "--device auto", "--device all", "value", renamed="--device", value=("auto", "all"),
                    example=("accumulate", "--n", "100", "--device", "auto"))


# kvcache runs on every device asked for, as the kernel commands do, but defaults to the CPU alone.
ALL_DEVICES_TOO = {("kvcache",)}


def _trigger(alias: Alias) -> tuple[str, ...]:
    return _TRIGGERS.get(alias.old, (alias.old.split()[-1],))


def _options(args: list[str], flags: set[str]) -> list[tuple[int, str, int]]:
    """(index, option name, index of its value or -1) for each option in args,
    up to `--`; an option takes a value unless it is a flag or spelled --opt=value."""
    found, i = [], 0
    while i < len(args):
        a = args[i]
        if a == "--":
            break
        if a.startswith("-") and len(a) > 1 and not _number(a):
            name, eq, _ = a.partition("=")
            takes = not eq and name not in flags
            found.append((i, name, i + 1 if takes and i + 1 < len(args) else -1))
            i += 2 if takes else 1
        else:
            i += 1
    return found


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def rewrite(argv: list[str], flags: set[str], kernel_commands: set[tuple[str, ...]]) -> tuple[list[str], list[str]]:
    """(argv in the new spelling, the notices to print). `flags`: every option
    of the app that takes no value; `kernel_commands`: the commands whose
    --device defaults to all."""
    flags = flags | _OLD_FLAGS
    notices: list[str] = []
    args = list(argv)
    for _ in range(2):  # an old verb may lead to another (compare model --layers --engine -> compare layers --engine)
        verbs = [a for a in ALIASES if a.kind == "verb" and tuple(args[:len(a.command)]) == a.command]
        if verbs:
            args = _verb(args, verbs, flags, notices)
    for alias in ALIASES:
        if alias.kind in ("option", "fold") and tuple(args[:len(alias.command)]) == alias.command:
            args = (_option if alias.kind == "option" else _fold)(args, alias, flags, notices)
    command = next((c for c in kernel_commands | ALL_DEVICES_TOO if tuple(args[:len(c)]) == c), None)
    if command is not None:
        args = _value(args, len(command), DEVICE_AUTO, flags, notices)
    return args, notices


def _verb(args: list[str], candidates: list[Alias], flags: set[str], notices: list[str]) -> list[str]:
    """compare model --metrics ... -> compare metrics ...; one mode at most."""
    n = len(candidates[0].command)
    rest = args[n:]
    names = {name for _, name, _ in _options(rest, flags)}
    chosen = [a for a in candidates if names & set(_trigger(a))]
    if any(a.verb == ("compare", "layers") for a in chosen):  # with --layers, --engine/--reference are the pair's
        chosen = [a for a in chosen if a.verb == ("compare", "layers")][:1]
    if not chosen:
        return args
    if len({a.verb for a in chosen}) > 1:
        raise UsageError(f"{' and '.join(a.old.split(' ', 2)[-1] for a in chosen)} are separate runs: give one "
                         f"({', '.join(' '.join(a.verb) for a in chosen)})")
    alias = chosen[0]
    if alias.drop:
        rest = _drop(rest, _trigger(alias), flags, keep_value=alias.verb == ("nondeterminism", "endpoint"))
    if alias.verb == ("compare", "engine-layers"):
        rest = _yours_as_engine(rest, flags)
    notices.append(_notice(alias.old, alias.new))
    return [*alias.verb, *rest]


def _yours_as_engine(rest: list[str], flags: set[str]) -> list[str]:
    """compare layers' YOURS was --model (default: the embedded model) or --engine; compare engine-layers
    names it --engine alone."""
    from precisionlab.engines.registry import DEFAULT_SPEC

    found = _options(rest, flags)
    models = [(i, v) for i, name, v in found if name == "--model"]
    if models and any(name == "--engine" for _, name, _ in found):
        raise UsageError("compare layers: give YOURS as --model or as --engine, not both")
    for i, _ in models:
        rest[i] = "--engine" + rest[i][len("--model"):]
    if not models and not any(name == "--engine" for _, name, _ in found):
        rest = [*rest, "--engine", DEFAULT_SPEC]  # the old --model's default
    return rest


def _drop(rest: list[str], names: tuple[str, ...], flags: set[str], keep_value: bool) -> list[str]:
    """rest without the option `names` (a mode flag); keep_value: its value
    moves to the front (nondeterminism --endpoint URL -> endpoint URL)."""
    out, front = list(rest), []
    for i, name, v in reversed(_options(rest, flags)):
        if name in names:
            if keep_value:
                front = [rest[i].partition("=")[2] or (rest[v] if v >= 0 else "")]
                del out[i:(v + 1 if v >= 0 else i + 1)]
            else:
                del out[i]
    return [*front, *out]


def _option(args: list[str], alias: Alias, flags: set[str], notices: list[str]) -> list[str]:
    n = len(alias.command)
    rest = args[n:]
    old = alias.old.split()[-1]
    hits = [(i, name) for i, name, _ in _options(rest, flags) if name == old]
    for i, _ in hits:
        rest[i] = alias.renamed + rest[i][len(old):]
    if hits:
        notices.append(_notice(alias.old, alias.new))
    return [*args[:n], *rest]


def _fold(args: list[str], alias: Alias, flags: set[str], notices: list[str]) -> list[str]:
    """The old options of a "fold" alias taken out (the last of each wins, as
    typer's would) and spelled as the new one by _FOLDS[their names]."""
    n = len(alias.command)
    rest = args[n:]
    olds = tuple(alias.renamed.split(","))
    found: dict[str, str] = {}
    for i, name, v in reversed(_options(rest, flags)):
        if name in olds:
            found.setdefault(name, rest[i].partition("=")[2] if "=" in rest[i] else (rest[v] if v >= 0 else ""))
            del rest[i:(v + 1 if v >= 0 and "=" not in rest[i] else i + 1)]
    if not found:
        return args
    notices.append(_notice(alias.old, alias.new))
    return [*args[:n], *_FOLDS[olds](found, rest, flags)]


def _fold_tol(found: dict[str, str], rest: list[str], flags: set[str]) -> list[str]:
    """--rtol R --atol A -> --tol R,A; one alone keeps its refusal (half a pair would mix in a default)."""
    if len(found) == 1:
        raise UsageError(f"Both --rtol and --atol must be either specified or omitted (got only {next(iter(found))})")
    return [*rest, "--tol", f"{found['--rtol']},{found['--atol']}"]


def _fold_dtypes(found: dict[str, str], rest: list[str], flags: set[str]) -> list[str]:
    """--a-dtype A --b-dtype B [--c-dtype C] -> --dtypes A,B[,C], '-' for a side as stored."""
    sides = [found.get(f"--{s}-dtype") or "-" for s in "abc"]
    return [*rest, "--dtypes", ",".join(sides if "--c-dtype" in found else sides[:2])]


def _fold_acc(found: dict[str, str], rest: list[str], flags: set[str]) -> list[str]:
    """--accumulator M --acc-bits B --acc-rounding R -> --accumulator M:bits=B:rounding=R
    for each limited model of M that does not spell its own (numerics.accumulators.fold_fields)."""
    from precisionlab.numerics import accumulators

    bits = found.get("--acc-bits")
    try:
        bits = None if bits is None else int(bits)
    except ValueError:
        raise UsageError(f"--acc-bits {bits!r}: a whole number") from None
    spots = [(i, v) for i, name, v in _options(rest, flags) if name == "--accumulator"]
    if not spots:
        raise UsageError("--acc-bits and --acc-rounding go with --accumulator")
    i, v = spots[-1]
    if "=" in rest[i]:
        rest[i] = "--accumulator=" + accumulators.fold_fields(rest[i].partition("=")[2], bits,
                                                              found.get("--acc-rounding"))
    elif v >= 0:
        rest[v] = accumulators.fold_fields(rest[v], bits, found.get("--acc-rounding"))
    return rest


def _fold_draft(found: dict[str, str], rest: list[str], flags: set[str]) -> list[str]:
    """--draft-tokens FILE -> --draft tokens:FILE; with --draft too, the old refusal (each gives the draft)."""
    if any(name == "--draft" for _, name, _ in _options(rest, flags)):
        raise UsageError("--draft and --draft-tokens each give the draft: give one of them")
    return [*rest, "--draft", "tokens:" + found["--draft-tokens"]]


_FOLDS = {("--rtol", "--atol"): _fold_tol, ("--a-dtype", "--b-dtype", "--c-dtype"): _fold_dtypes,
          ("--acc-bits", "--acc-rounding"): _fold_acc, ("--draft-tokens",): _fold_draft}


def _value(args: list[str], n: int, alias: Alias, flags: set[str], notices: list[str]) -> list[str]:
    rest = args[n:]
    old, new = alias.value
    hit = False
    for i, name, v in _options(rest, flags):
        if name != alias.renamed:
            continue
        if "=" in rest[i] and rest[i].partition("=")[2].lower() == old:
            rest[i], hit = f"{name}={new}", True
        elif v >= 0 and rest[v].lower() == old:
            rest[v], hit = new, True
    if hit:
        notices.append(_notice(f"{' '.join(args[:n])} {alias.old}", f"{' '.join(args[:n])} {alias.new}"))
    return [*args[:n], *rest]


def _notice(old: str, new: str) -> str:
    return f"'{old}' is now '{new}'; the old spelling goes in the next release"
