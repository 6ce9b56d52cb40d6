"""torch's precision switches are set in one module (runtime/torch_flags.py):
no other module of the package writes them, and what it sets it restores."""

import ast
from pathlib import Path

import pytest

from precisionlab.runtime import torch_flags

PACKAGE = Path(__file__).resolve().parent.parent / "precisionlab"
HOME = PACKAGE / "runtime" / "torch_flags.py"
# Attributes whose assignment changes an fp32 matmul's or convolution's precision.
FLAG_ATTRIBUTES = {"allow_tf32", "fp32_precision", "allow_bf16_reduced_precision_reduction",
                   "allow_fp16_reduced_precision_reduction"}
FLAG_CALLS = {"set_float32_matmul_precision"}


def _touches(tree: ast.AST) -> list[int]:
    """Line numbers of each write of a flag: an assignment to one of the
    attributes (plain, augmented, annotated, or through setattr) or a call of
    a setter, whatever the object is called locally."""
    lines = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        lines += [t.lineno for t in targets if isinstance(t, ast.Attribute) and t.attr in FLAG_ATTRIBUTES]
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in FLAG_CALLS:
                lines.append(node.lineno)
            if name == "setattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value in FLAG_ATTRIBUTES:
                lines.append(node.lineno)
    return lines


def test_the_detector_finds_each_kind_of_write():
    src = ("torch.backends.cuda.matmul.allow_tf32 = False\nm.fp32_precision = 'tf32'\n"
           "t.set_float32_matmul_precision('high')\nsetattr(m, 'allow_tf32', True)\nx = m.allow_tf32\n")
    assert _touches(ast.parse(src)) == [1, 2, 3, 4]  # reading a flag (line 5) is not setting it


def test_only_runtime_torch_flags_sets_the_flags():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != HOME:
            lines = _touches(ast.parse(path.read_text(), str(path)))
            if lines:
                found[str(path.relative_to(PACKAGE))] = lines
    assert not found, f"set the precision flags through precisionlab.runtime.torch_flags: {found}"
    assert _touches(ast.parse(HOME.read_text()))  # and the home module is where they are set


@pytest.mark.parametrize("start", ["highest", "high", "medium"])
def test_ieee_fp32_turns_tf32_off_and_restores(start):
    torch = pytest.importorskip("torch")
    was = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision(start)
        torch.backends.cudnn.allow_tf32 = True
        before = torch_flags.torch_flags()
        with torch_flags.ieee_fp32():
            inside = torch_flags.torch_flags()
        assert inside["torch.backends.cuda.matmul.allow_tf32"] is False
        assert inside["torch.backends.cudnn.allow_tf32"] is False
        assert inside["torch.get_float32_matmul_precision()"] == "highest"
        assert torch_flags.torch_flags() == before
    finally:
        torch.set_float32_matmul_precision(was[0])
        torch.backends.cudnn.allow_tf32 = was[1]


def test_an_unknown_matmul_mode_is_refused():
    pytest.importorskip("torch")
    before = torch_flags.torch_flags()
    with pytest.raises(ValueError):
        with torch_flags.matmul_mode("tf32 (typo)"):
            pass
    assert torch_flags.torch_flags() == before
