"""scripts/update_docs.py --check's normaliser: timings, machine names and paths
are ignored, a result's digit never is."""

import importlib.util

import pytest

from helpers import ROOT

_spec = importlib.util.spec_from_file_location("update_docs", ROOT / "scripts" / "update_docs.py")
update_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(update_docs)
normalise = update_docs.normalise

TF32 = """\
matmul 256x256 @ 256x256 against float64
┏━━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━┓
┃ device ┃ mode ┃ emulated ┃   rel L2 ┃  max abs ┃ time (ms) ┃ TFLOP/s ┃
┡━━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━┩
│ cpu    │ fp32 │ no       │ 2.96e-07 │ 7.61e-05 │      9.66 │    0.22 │
│ cpu    │ tf32 │ yes      │ 2.94e-04 │ 4.91e-02 │     32.43 │    0.07 │
└────────┴──────┴──────────┴──────────┴──────────┴───────────┴─────────┘
load 0.02 s, run 0.27 s (after the torch import)
"""
# the same run, slower: one time wider than its column was, so Rich widened the column
TF32_SLOWER = """\
matmul 256x256 @ 256x256 against float64
┏━━━━━━━━┳━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━┓
┃ device ┃ mode ┃ emulated ┃   rel L2 ┃  max abs ┃  time (ms) ┃ TFLOP/s ┃
┡━━━━━━━━╇━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━┩
│ cpu    │ fp32 │ no       │ 2.96e-07 │ 7.61e-05 │   10123.50 │    0.01 │
│ cpu    │ tf32 │ yes      │ 2.94e-04 │ 4.91e-02 │      31.02 │    0.08 │
└────────┴──────┴──────────┴──────────┴──────────┴────────────┴─────────┘
load 1.5 s, run 12 s (after the torch import)
"""


def test_timings_differ_the_texts_normalise_equal():
    assert TF32 != TF32_SLOWER and normalise(TF32) == normalise(TF32_SLOWER)


def test_a_result_digit_differs():
    for old, new in [("2.96e-07", "2.97e-07"), ("4.91e-02", "4.91e-03"), ("│ tf32 │ yes", "│ tf32 │ no ")]:
        assert normalise(TF32) != normalise(TF32.replace(old, new, 1)), old


def test_numbers_without_a_time_unit_are_results():
    a = "• bf16 sequential stalled for good at 32.0 (step 277); 50 greedy steps, 8 threads, 4x16384B->8192\n"
    assert normalise(a) == a
    assert normalise(a) != normalise(a.replace("277", "278"))
    assert normalise("run 2.50 s (2.50 s of CPU)") == normalise("run 31 s (0.4 s of CPU)")
    assert normalise("in 3 ms") == normalise("in 4.5 µs") == normalise("in 9 ns") == "in <time>\n"


def test_only_the_timing_columns_are_ignored():
    bench = ("┏━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━┓\n"
             "┃ kernel     ┃ dtype ┃ n        ┃ ns/element ┃ x numpy.sum ┃ target ns ┃\n"
             "┡━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━┩\n"
             "│ sequential │ fp32  │ 10000000 │      1.291 │        6.74 │         2 │\n"
             "└────────────┴───────┴──────────┴────────────┴─────────────┴───────────┘\n")
    assert normalise(bench) == normalise(bench.replace("1.291", "9.876").replace("6.74", "0.12"))
    assert normalise(bench) != normalise(bench.replace("10000000", "10000001"))  # the size is a parameter
    assert normalise(bench) != normalise(bench.replace("│         2 │", "│         3 │"))  # target: a constant


def test_machine_names_paths_and_versions_are_ignored():
    a = ('{\n  "versions": {\n    "python": "3.11.7",\n    "torch": "2.13.0+cpu"\n  },\n  "cpu_name": "AMD EPYC",\n'
         '  "library": {\n    "path": "/work/main/precisionlab/lib/libprecisionlab.so",\n    "abi": 2\n  },\n'
         '  "gpu_name": null,\n  "exact_stored": 1.0\n}\n')
    b = (a.replace("3.11.7", "3.12.1").replace("AMD EPYC", "Intel(R) Xeon(R) Gold 6338")
         .replace("/work/main/", "/home/ci/clone/").replace('"gpu_name": null', '"gpu_name": "NVIDIA H200"'))
    assert normalise(a) == normalise(b)
    assert normalise(a) != normalise(a.replace('"abi": 2', '"abi": 3'))
    assert normalise(a) != normalise(a.replace('"exact_stored": 1.0', '"exact_stored": 1.5'))
    assert normalise("wrote /tmp/tmpab12_x/fp32.safetensors") == normalise("wrote /tmp/tmpzz99/fp32.safetensors")
    assert normalise(a) == normalise(a.replace("/work/main/precisionlab/lib/", "/opt/emu/build/"))  # $PRECISIONLAB_LIB


def test_examples_are_found_with_their_marks():
    text = ("```\n$ precisionlab info\nx\n```\n<!-- example: gpu -->\n```\n$ precisionlab bench --device cuda\ny\n```\n"
            "```\nnot an example\n```\n")
    found = [(m.group("mark"), m.group("cmd")) for m in update_docs.BLOCK.finditer(text)]
    assert found == [(None, "info"), ("gpu", "bench --device cuda")]


def test_an_example_recorded_on_another_cpu_is_compared_without_its_digits():
    text = "<!-- example: cpu AMD EPYC -->\n```\n$ precisionlab tf32 --m 64\nrel L2 1.25e-07\n```\n"
    m = update_docs.BLOCK.search(text)
    assert (m.group("mark"), m.group("arg"), m.group("cmd")) == ("cpu", "AMD EPYC", "tf32 --m 64")
    a, b = normalise("rel L2 1.25e-07 flagged\n"), normalise("rel L2 1.37e-07 flagged\n")
    assert a != b and update_docs.mask_numbers(a) == update_docs.mask_numbers(b)
    assert update_docs.mask_numbers(a) != update_docs.mask_numbers(normalise("rel L2 1.25e-07 ok\n"))  # the words count


def test_engine_models_are_exported_only_for_the_examples_that_read_them(monkeypatch, tmp_path):
    ran = []
    monkeypatch.setattr(update_docs, "ROOT", tmp_path)  # the folder it makes, here
    monkeypatch.setattr(update_docs, "run", lambda cmd: (ran.append(cmd), ("", 0, ""))[1])
    assert update_docs.export_engine_models(["info", "compare model --dtypes bf16"]) == [] and ran == []
    cmd = f"compare engine --engine ct2:{update_docs.ENGINE_DATA}ct2-int8"
    assert update_docs.export_engine_models([cmd]) == [] and (tmp_path / update_docs.ENGINE_DATA).is_dir()
    assert ran == [f"export embedded --to {to} --out {update_docs.ENGINE_DATA}{name} --force"
                   for to, name in update_docs.ENGINE_MODELS]
    monkeypatch.setattr(update_docs, "run", lambda cmd: ("", 2, ""))  # an engine's package missing: said, one line each
    failures = update_docs.export_engine_models([cmd])
    assert len(failures) == len(update_docs.ENGINE_MODELS) and all("make engines" in f for f in failures)


def test_pages_named_on_the_command_line_are_the_only_ones_run(monkeypatch):
    monkeypatch.chdir(ROOT)
    every = update_docs.files()
    assert every[0] == ROOT / "README.md" and ROOT / "docs" / "install.md" in every  # a new page needs no edit
    assert update_docs.files(["docs/softmax.md", "./docs/softmax.md"]) == [ROOT / "docs" / "softmax.md"]
    for wrong in (["docs/nonexistent.md"], ["DEVELOPERS.md"], ["docs/data"]):
        with pytest.raises(ValueError, match="not README.md or docs"):
            update_docs.files(wrong)


def test_an_example_may_keep_the_head_or_the_tail_of_its_output(monkeypatch):
    """`| head -N` keeps the first N lines, `| tail -N` the last N (a long table's summary)."""
    import subprocess

    out = "\n".join(f"line {i}" for i in range(10)) + "\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, ""))
    assert update_docs.run("info | head -2") == ("line 0\nline 1\n", 0, "")
    assert update_docs.run("info | tail -2") == ("line 8\nline 9\n", 0, "")


def test_an_example_from_another_cpu_must_run_but_its_words_may_be_that_cpus(monkeypatch, tmp_path):
    """Recorded on another CPU: the masked text is compared; where even the words differ (a sampled string,
    a verdict at a rounding-sized margin) it must still run cleanly and is listed, not failed. On the CPU it
    was recorded on, every character counts."""
    from types import SimpleNamespace

    monkeypatch.setattr(update_docs, "ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("<!-- example: cpu OTHER CPU -->\n```\n$ precisionlab compare rollout\nsample 1: 'to be'\n```\n")
    args = SimpleNamespace(check=True, only=None, gpu=False)

    def check(out, code=0, err="", cpu="THIS CPU"):
        monkeypatch.setattr(update_docs, "run", lambda cmd: (out, code, err))
        return update_docs.check_file(page, args, cpu)

    same = check("sample 2: 'to be'\n")
    assert same["failures"] == [] and same["other_cpu"] == [] and same["masked"] == 1  # only a number moved
    words = check("sample 1: 'or not'\n")
    assert words["failures"] == [] and len(words["other_cpu"]) == 1
    for bad in (dict(code=2), dict(err="precisionlab: internal error: KeyError"), dict(out="")):
        res = check(**{"out": "sample 1: 'or not'\n", **bad})
        assert len(res["failures"]) == 1 and res["other_cpu"] == [], bad
    assert len(check("sample 1: 'or not'\n", cpu="OTHER CPU")["failures"]) == 1  # recorded here: compared
