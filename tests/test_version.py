"""`precisionlab --version`, shell completion and the JSON schema version: what
they report, and that none of them imports torch."""

from importlib import metadata

import pytest
from helpers import cli, cli_in_process, strict_json

from precisionlab import __version__, native
from precisionlab.report import jsondoc
from precisionlab.runtime.version import describe_build, parse_build_info

NVCC_INFO = ("compiler=nvcc 13.0; flags=nvcc -O3 --fmad=false -cudart static -gencode arch=compute_90,code=sm_90 "
             "-gencode arch=compute_90,code=compute_90 -gencode arch=compute_100,code=sm_100 "
             "-Xcompiler -fPIC,-ffp-contract=off; cuda_archs=900,1000")
HOST_INFO = "compiler=c++ (host only); flags=g++ -O2 -std=c++17 -fPIC -ffp-contract=off; cuda_archs=none"


def test_build_info_is_parsed_into_archs():
    b = parse_build_info(NVCC_INFO)
    assert (b.compiler, b.host_only, b.sass, b.ptx) == ("nvcc 13.0", False, ("sm_90", "sm_100"), ("compute_90",))
    assert describe_build(b) == "nvcc 13.0, sm_90 SASS + sm_100 SASS + compute_90 PTX"
    h = parse_build_info(HOST_INFO)
    assert (h.host_only, h.sass, h.ptx) == (True, (), ())
    assert describe_build(h) == "host-only (built without nvcc: no GPU kernels)"
    emu = parse_build_info("compiler=nvcc __CUDACC_VER_MAJOR__.__CUDACC_VER_MINOR__; "
                           "flags=pl_emu: the CUDA kernels on the CPU; cuda_archs=none")
    assert describe_build(emu).startswith("the CPU emulator of the CUDA kernels")


def test_version_names_package_library_and_build():
    r = cli("--version")
    assert r.code == 0 and r.err == ""
    lines = r.out.splitlines()
    assert lines[0] == f"precisionlab {__version__}" == f"precisionlab {metadata.version('precisionlab')}"
    build = parse_build_info(native.build_info())
    assert lines[1] == f"library: ABI {native.ABI_VERSION}, {describe_build(build)}"
    assert lines[2] == f"library path: {native.library_path()}"
    assert not any(line.startswith("torch") for line in lines)  # torch was not imported


def test_version_without_the_library_still_answers():
    r = cli("--version", env={"PRECISIONLAB_LIB": "/nonexistent/libprecisionlab.so"})
    assert r.code == 0
    assert r.out.splitlines()[1] == "library: unavailable: PRECISIONLAB_LIB=/nonexistent/libprecisionlab.so does not exist"


@pytest.mark.parametrize("argv", [["--version"], ["--show-completion"], ["--help"]])
def test_version_completion_and_help_never_import_torch(argv):
    assert "TORCH=False" in cli_in_process(*argv, from_bash=True).stderr


def test_version_names_torch_when_it_is_already_imported():
    torch = pytest.importorskip("torch")
    p = cli_in_process("--version", pre="import torch", from_bash=True)
    assert f"torch {torch.__version__}" in p.stdout.splitlines()


def test_completion_is_offered_for_the_command():
    r = cli("--help")
    assert "--install-completion" in r.out and "--show-completion" in r.out
    script = cli_in_process("--show-completion", from_bash=True)
    assert "complete -o default -F _precisionlab_completion precisionlab" in script.stdout
    env = {"_PRECISIONLAB_COMPLETE": "complete_bash", "COMP_WORDS": "precisionlab accumulate --dt", "COMP_CWORD": "2"}
    assert cli(env=env).out.split() == ["--dtype"]


@pytest.mark.parametrize("argv", [["accumulate", "--n", "10", "--device", "cpu"],
                                  ["softmax", "--values", "1,2,3", "--device", "cpu"], ["info"]])
def test_every_json_document_carries_the_schema_version(argv):
    d = strict_json(cli(*argv, "--json").out)
    assert isinstance(jsondoc.SCHEMA_VERSION, int) and d["schema_version"] == jsondoc.SCHEMA_VERSION
    assert list(d)[:2] == ["schema_version", "command"]
