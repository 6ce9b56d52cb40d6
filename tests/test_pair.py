"""compare pair A B: two logits files of one engine at one precision judged
as a contract from the files alone (issue 40). The files come from the
independent plain-PyTorch Qwen3 of tests/qwen3_plain.py: prefill vs decode,
whole vs chunked, alone vs left-padded. Its three planted bugs (a bf16 KV cache
on decode only, a chunk-boundary mask, unmasked left padding) are called
algorithmic, beyond fp32 rounding and, given the fp64 pair, persisting in
fp64; the clean engine's pairs are rounding; the chunk bug's breaks begin at
chunk starts."""

import numpy as np
import pytest
import torch
from helpers import cli, json_glossary_problems, save_tiny_qwen, strict_json

from precisionlab.errors import UsageError
from precisionlab.experiments import pair as exp
from precisionlab.io import logits_file

pytest.importorskip("transformers")
CHUNK, PADS = 4, 5
PAIRS = {"kv_bf16_decode": "decode", "chunk_mask": "chunked", "unmasked_padding": "padded"}


def _rows(engine, dtype, how, seq):
    model = engine.model(dtype)
    ids = torch.tensor([seq])
    whole = engine.forward(model, ids)[0]
    if how == "decode":
        feed = engine.session(model)
        other = torch.cat([feed(seq[i:i + 1]) for i in range(len(seq))])
    elif how == "chunked":
        feed = engine.session(model)
        other = torch.cat([feed(seq[i:i + CHUNK]) for i in range(0, len(seq), CHUNK)])
    else:
        mask = torch.ones(1, len(seq) + PADS, dtype=torch.long)
        mask[0, :PADS] = 0
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        other = engine.forward_batch(model, torch.tensor([[0] * PADS + seq]), mask, pos)[0, PADS:]
    return whole.double().numpy(), other.double().numpy()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from qwen3_user_engine import engine

    d = tmp_path_factory.mktemp("pairs")
    folder = str(save_tiny_qwen(d / "tiny"))
    seq = np.random.default_rng(0).integers(1, 12, size=25).tolist()
    out = {}
    for bug in (None, *PAIRS):
        e = engine(folder, bug)
        for how in ("decode", "chunked", "padded"):
            for dtype in ("fp32", "fp64"):
                a, b = _rows(e, dtype, how, seq)
                paths = []
                for side, rows in (("a", a), ("b", b)):
                    p = d / f"{bug}-{how}-{dtype}-{side}.safetensors"
                    stored = rows.astype(np.float32 if dtype == "fp32" else np.float64)[:-1]
                    logits_file.write(str(p), stored, np.array(seq[1:]), {"dtype": dtype})
                    paths.append(str(p))
                out[bug, how, dtype] = paths
    return out


@pytest.mark.parametrize("bug", sorted(PAIRS))
def test_each_bug_is_found_from_files_alone(files, bug):
    how = PAIRS[bug]
    a, b = files[bug, how, "fp32"]
    res = exp.run(exp.PairConfig(a, b))
    assert res.row["verdict"] == "algorithmic" and "beyond fp32 rounding" in res.row["note"], res.row
    assert res.failures and res.row["worst_bound_ratio"] > 10
    a64, b64 = files[bug, how, "fp64"]
    res = exp.run(exp.PairConfig(a, b, a64, b64))
    assert res.row["verdict"] == "algorithmic" and res.row["note"].startswith("persists in fp64"), res.row
    first = res.row["first_beyond_rounding_position"]
    assert first == {"decode": 1, "chunked": CHUNK, "padded": 0}[how]  # where the bug first acts


def test_the_clean_engine_is_rounding_every_way(files):
    for how in ("decode", "chunked", "padded"):
        a, b = files[None, how, "fp32"]
        a64, b64 = files[None, how, "fp64"]
        for cfg in (exp.PairConfig(a, b), exp.PairConfig(a, b, a64, b64)):
            res = exp.run(cfg)
            assert res.row["verdict"] in ("holds", "rounding") and not res.failures, (how, res.row)
        assert exp.run(exp.PairConfig(a, b)).row["worst_bound_ratio"] < 1


def test_chunk_breaks_begin_at_chunk_starts(files):
    a, b = files["chunk_mask", "chunked", "fp32"]
    c = exp.run(exp.PairConfig(a, b, chunk=CHUNK)).row["chunks"]
    assert c["at_chunk_starts"] and c["first_chunk_clean"] and c["chunks_broken"] == c["chunks"] - 1
    a, b = files["kv_bf16_decode", "decode", "fp32"]
    c = exp.run(exp.PairConfig(a, b, chunk=CHUNK)).row["chunks"]
    assert not c["at_chunk_starts"]  # decode's breaks are everywhere after the first token, not at chunk starts


def test_cli_exit_codes_json_and_refusals(files):
    a, b = files["chunk_mask", "chunked", "fp32"]
    r = cli("compare", "pair", a, b, "--chunk", str(CHUNK), "--json")
    assert r.code == 0, r.err  # a verdict, as compare contracts gives one; --fail-on-break makes it a gate
    assert cli("compare", "pair", a, b, "--fail-on-break").code == 1
    doc = strict_json(r.out)
    assert doc["command"] == "compare pair" and doc["rows"][0]["verdict"] == "algorithmic"
    assert json_glossary_problems(doc) == []
    a, b = files[None, "decode", "fp32"]
    r = cli("compare", "pair", a, b)
    assert r.code == 0 and "rounding" in r.out, r.err
    for args, needle in (([a], "takes A B"), ([a, b, "--exact", a], "give it twice"),
                         ([a, b, "--chunk", "0"], "positive"), ([a, b, "--dtype", "fp7"], "--dtype")):
        r = cli("compare", "pair", *args)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and needle in r.err, (args, r.err)
    with pytest.raises(UsageError, match="no such file"):
        exp.run(exp.PairConfig(a, b + ".missing"))
