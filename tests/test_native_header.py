"""cuda/precisionlab.h against the Python side of the boundary: every prototype
in the header is bound in native._PROTOTYPES with the same argument count and
ctypes types, every binding is in the header, and every ctypes.Structure
mirror in precisionlab/native/ has its struct's fields, in order, with their
types. No library is needed: the header text is parsed. The last tests change
a copy of the header and show that the checker then fails."""

from __future__ import annotations

import ctypes
import importlib
import pkgutil
import re
from ctypes import POINTER
from pathlib import Path

import precisionlab.native as native_pkg
from precisionlab.native import loader

HEADER = Path(__file__).resolve().parent.parent / "cuda" / "precisionlab.h"

# C scalar types and the ctypes type each must be bound as (identity: on
# LP64, c_int32 is c_int and c_size_t is c_uint64, as the C ABI has them).
SCALARS = {
    "int": ctypes.c_int, "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t, "double": ctypes.c_double, "float": ctypes.c_float,
    "uint8_t": ctypes.c_uint8, "char": ctypes.c_char,
}


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)  # the preprocessor's lines
    return text.replace('extern "C" {', " ")


def _parse_type(decl: str) -> tuple[str, int]:
    """'const double* x' -> ('double', 1): the base type and the pointer depth (name dropped)."""
    decl = re.sub(r"\bconst\b|\bstruct\b", " ", decl)
    depth = decl.count("*")
    words = decl.replace("*", " ").split()
    if len(words) == 2:  # a type and a name
        words = words[:1]
    assert len(words) == 1, decl
    return words[0], depth


def parse_header(text: str) -> tuple[dict, dict]:
    """(functions, structs): name -> (return type, [argument types]) and
    struct name -> [(field, type)], each type a (base, pointer depth) pair."""
    src = _strip_comments(text)
    structs = {}
    for m in re.finditer(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;|struct\s+(\w+)\s*\{(.*?)\}\s*;", src, re.S):
        body, name = (m.group(1), m.group(2)) if m.group(2) else (m.group(4), m.group(3))
        fields = []
        for decl in body.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            first, *more = [d.strip() for d in decl.split(",")]
            base_decl = re.match(r"(.*?)(\**\s*\w+)$", first)
            base, tail = base_decl.group(1), base_decl.group(2)
            for d in [tail, *more]:
                fname = d.replace("*", "").strip()
                fields.append((fname, _parse_type(base + "*" * d.count("*"))))
        structs[name] = fields
    functions = {}
    flat = re.sub(r"typedef\s+struct\s*\{.*?\}\s*\w+\s*;|struct\s+\w+\s*\{.*?\}\s*;|enum\s*\w*\s*\{.*?\}\s*;", " ",
                  src, flags=re.S)
    for statement in flat.replace("}", " ").split(";"):
        m = re.fullmatch(r"\s*([\w\s\*]+?)\b(pl_\w+)\s*\(([^)]*)\)\s*", statement)
        if not m:
            continue
        ret = _parse_type(m.group(1).strip())
        args = m.group(3).strip()
        argv = [] if args in ("", "void") else [_parse_type(a.strip()) for a in args.split(",")]
        functions[m.group(2)] = (ret, argv)
    return functions, structs


def mirrors() -> dict[str, type]:
    """Every ctypes.Structure in precisionlab/native/, by the C struct its `# pl_...` comment names."""
    out = {}
    for info in pkgutil.iter_modules(native_pkg.__path__):
        mod = importlib.import_module(f"precisionlab.native.{info.name}")
        src = Path(mod.__file__).read_text()
        for name, obj in vars(mod).items():
            if isinstance(obj, type) and issubclass(obj, ctypes.Structure) and obj.__module__ == mod.__name__:
                m = re.search(rf"class {name}\(ctypes\.Structure\):\s*#\s*(?:struct\s+)?(pl_\w+)", src)
                assert m, f"{mod.__name__}.{name} does not name its C struct in a `# pl_...` comment"
                out[m.group(1)] = obj
    return out


def _accepts(ctype, c: tuple[str, int], structs: dict, mirror_of: dict) -> bool:
    """Whether ctype may stand for the C type c = (base, depth)."""
    base, depth = c
    if depth == 0:
        if base in mirror_of:
            return ctype is mirror_of[base]
        return SCALARS.get(base) is ctype
    if ctype is ctypes.c_void_p:  # any data pointer may be passed as void*
        return True
    if (base, depth) == ("char", 1):
        return ctype is ctypes.c_char_p
    if base == "void" and depth == 1:
        return False  # void* only as c_void_p (above)
    inner = (base, depth - 1)
    pointee = getattr(ctype, "_type_", None)
    if not isinstance(ctype, type) or not issubclass(ctype, ctypes._Pointer) or pointee is None:
        return False
    if inner == ("void", 1):
        return pointee is ctypes.c_void_p
    return _accepts(pointee, inner, structs, mirror_of)


def problems(header_text: str, prototypes: dict, mirror_of: dict) -> list[str]:
    functions, structs = parse_header(header_text)
    out = []
    for name in sorted(set(functions) - set(prototypes)):
        out.append(f"{name}: in the header, not bound")
    for name in sorted(set(prototypes) - set(functions)):
        out.append(f"{name}: bound, not in the header")
    for name in sorted(set(functions) & set(prototypes)):
        (ret, args), (restype, argtypes) = functions[name], prototypes[name]
        if not _accepts(restype, ret, structs, mirror_of):
            out.append(f"{name}: returns {ret}, bound as {restype}")
        if len(args) != len(argtypes):
            out.append(f"{name}: {len(args)} arguments in the header, {len(argtypes)} bound")
            continue
        for i, (a, t) in enumerate(zip(args, argtypes, strict=True)):
            if not _accepts(t, a, structs, mirror_of):
                out.append(f"{name}: argument {i} is {a}, bound as {t}")
    for cname, cls in sorted(mirror_of.items()):
        if cname not in structs:
            out.append(f"{cls.__name__}: mirrors {cname}, which the header lacks")
            continue
        want, have = structs[cname], list(cls._fields_)
        if [f for f, _ in want] != [f for f, _ in have]:
            out.append(f"{cls.__name__}: fields {[f for f, _ in have]}, {cname} has {[f for f, _ in want]}")
            continue
        for (f, ct), (_, t) in zip(want, have, strict=True):
            if not _accepts(t, ct, structs, mirror_of):
                out.append(f"{cls.__name__}.{f}: {ct} in {cname}, mirrored as {t}")
    return out


def test_the_header_parses_into_what_it_declares():
    functions, structs = parse_header(HEADER.read_text())
    assert functions["pl_round"] == (("int", 0), [("double", 1), ("int64_t", 0), ("int", 0), ("double", 1)])
    assert functions["pl_abi_version"] == (("int", 0), [])
    assert functions["pl_last_error"] == (("char", 1), [])
    assert structs["pl_block_format_desc"][0] == ("name", ("char", 1))
    assert len(functions) > 50 and {"pl_variant_desc", "pl_format_desc", "pl_minifloat_desc"} <= set(structs)


def test_every_prototype_and_struct_mirror_matches_the_header():
    found = mirrors()
    assert {"pl_variant_desc", "pl_format_desc", "pl_minifloat_desc", "pl_block_format_desc",
            "pl_sass_rule"} <= set(found)
    assert problems(HEADER.read_text(), loader._PROTOTYPES, found) == []


def test_a_changed_argument_type_is_caught():
    text = HEADER.read_text()
    changed = text.replace("int pl_round(const double* x, int64_t n, int format, double* y);",
                           "int pl_round(const double* x, int n, int format, double* y);")
    assert changed != text
    assert problems(changed, loader._PROTOTYPES, mirrors()) == ["pl_round: argument 1 is ('int', 0), bound as "
                                                                f"{ctypes.c_int64}"]


def test_a_dropped_argument_a_dropped_field_and_an_unbound_function_are_caught():
    text = HEADER.read_text()
    changed = text.replace("int pl_sum_cpu_threads(const double* x, int64_t n, int threads, double* result);",
                           "int pl_sum_cpu_threads(const double* x, int64_t n, double* result);\n"
                           "int pl_not_bound(void);")
    changed = changed.replace("    int32_t bytes;          /* bytes a value takes in the library's buffers */\n", "")
    assert changed.count("pl_not_bound") == 1 and "int32_t bytes;" not in changed
    got = problems(changed, loader._PROTOTYPES, mirrors())
    assert "pl_not_bound: in the header, not bound" in got
    assert "pl_sum_cpu_threads: 3 arguments in the header, 4 bound" in got
    assert any(p.startswith("_FormatDesc: fields") for p in got), got


def test_a_pointer_bound_to_the_wrong_pointee_is_caught():
    protos = dict(loader._PROTOTYPES)
    protos["pl_cuda_versions"] = (ctypes.c_int, [POINTER(ctypes.c_double), POINTER(ctypes.c_int)])
    assert problems(HEADER.read_text(), protos, mirrors()) == [
        f"pl_cuda_versions: argument 0 is ('int', 1), bound as {POINTER(ctypes.c_double)}"]
