"""compare contracts on what the user brings (issue 40): a llama.cpp GGUF runs
with the default --dtypes (the ones it computes in: fp32) and reports each
contract it cannot make as "not supported" while the rest run; --token-ids
takes the user's ids from a text file, a .npy or a dump's
precisionlab.token_ids, and refuses anything else in one line."""

import json

import numpy as np
import pytest
from helpers import cli, strict_json

from precisionlab.errors import UsageError
from precisionlab.io import token_ids


def test_token_ids_from_text_npy_and_a_dump(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    (tmp_path / "ids.txt").write_text("[5, 6,7\n8 9]\n")
    np.save(tmp_path / "ids.npy", np.array([5, 6, 7, 8, 9], dtype=np.int64))
    save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "dump.safetensors"),
              metadata={"precisionlab.token_ids": json.dumps([5, 6, 7, 8, 9])})
    for name in ("ids.txt", "ids.npy", "dump.safetensors"):
        assert token_ids.read(str(tmp_path / name)) == [5, 6, 7, 8, 9]
    (tmp_path / "bad.txt").write_text("1 -2")
    np.save(tmp_path / "floats.npy", np.ones(3))
    save_file({"x": np.zeros(2, np.float32)}, str(tmp_path / "plain.safetensors"))
    for name, needle in (("bad.txt", "not a token id"), ("floats.npy", "1-d integers"),
                         ("plain.safetensors", "no precisionlab.token_ids"), ("none.txt", "no such file")):
        with pytest.raises(UsageError, match=needle):
            token_ids.read(str(tmp_path / name))


def test_contracts_run_on_the_users_ids(tmp_path):
    (tmp_path / "ids.txt").write_text("5 6 7 8 9 10")
    r = cli("compare", "contracts", "--token-ids", str(tmp_path / "ids.txt"), "--steps", "3", "--dtypes", "fp32",
            "--batches", "2", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["params"]["prompt_from"] == "--token-ids" and doc["params"]["prompt_tokens"] == 6
    assert doc["params"]["positions"] == 9
    (tmp_path / "big.txt").write_text("100000")
    r = cli("compare", "contracts", "--token-ids", str(tmp_path / "big.txt"), "--steps", "3")
    assert r.code == 2 and "outside the model's vocabulary" in r.err and len(r.err.strip().splitlines()) == 1


def test_llamacpp_runs_with_the_default_dtypes(tmp_path):
    pytest.importorskip("llama_cpp", reason="the llamacpp engine needs llama-cpp-python")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    gguf = tmp_path / "emb.gguf"
    r = cli("export", "embedded", "--to", "gguf:f32", "--out", str(gguf))
    assert r.code == 0, r.err
    r = cli("compare", "contracts", "--model", f"llamacpp:{gguf}", "--steps", "4", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["params"]["dtypes"] == ["fp32"]  # bf16 left out: llama.cpp computes as the GGUF says
    verdicts = {row["label"]: row["verdict"] for row in doc["rows"]}
    assert verdicts["8 pads, batch of 1"] == "not supported"
    assert all(v in ("holds", "unresolved", "not supported") for v in verdicts.values()), verdicts
    assert sum(v != "not supported" for v in verdicts.values()) >= 10  # the rest ran
