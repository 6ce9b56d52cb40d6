"""compare engine at the engine's speed, on the same tokens (issue 39): the
reference cache's key and its hits, the tokenizer-disagreement finding on a
planted merge, and llama.cpp's session (its own KV cache) against a full
re-evaluation."""

from __future__ import annotations

import numpy as np
import pytest
from shift_engine import ShiftEngine

from precisionlab.engines import registry
from precisionlab.experiments import engines as eexp
from precisionlab.experiments import token_agreement
from precisionlab.io import reference_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PRECISIONLAB_REFERENCE_CACHE", str(tmp_path / "ref"))
    return tmp_path / "ref"


# ---------------------------------------------------------------------------
# the cache's key


def test_key_changes_with_text_model_files_and_dtype(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"0123")
    spec = f"hf:{model}"
    base = dict(text_sha256=reference_cache.text_digest("a text"), tokens=8, dtype="fp32")
    k = reference_cache.key(reference_cache.model_identity(spec), **base)
    assert k == reference_cache.key(reference_cache.model_identity(spec), **base)  # the same run: a hit
    assert k != reference_cache.key(reference_cache.model_identity(spec),
                                    **{**base, "text_sha256": reference_cache.text_digest("a text.")})
    assert k != reference_cache.key(reference_cache.model_identity(spec), **{**base, "dtype": "bf16"})
    assert k != reference_cache.key(reference_cache.model_identity(spec), **{**base, "tokens": 9})
    (model / "model.safetensors").write_bytes(b"01234")  # other weights (another size)
    assert k != reference_cache.key(reference_cache.model_identity(spec), **base)
    other = tmp_path / "m2"
    model.rename(other)
    assert k != reference_cache.key(reference_cache.model_identity(f"hf:{other}"), **base)


def test_store_load_round_trip_and_a_broken_entry_misses(cache):
    rows = np.array([[1.5, -2.0], [np.inf, 3.0]], dtype=np.float32)
    reference_cache.store("k1", {"info": {"vocab": 2}}, {"logits": rows})
    meta, arrays = reference_cache.load("k1")
    assert meta["info"] == {"vocab": 2} and arrays["logits"].dtype == np.float32
    assert np.array_equal(arrays["logits"], rows)
    assert reference_cache.load("k2") is None
    (cache / "k3.npz").write_bytes(b"not an archive")
    assert reference_cache.load("k3") is None
    (cache / "k1.npz").rename(cache / "k4.npz")  # an entry under another key's name is not that key's
    assert reference_cache.load("k4") is None


def test_compact_keeps_float64_that_float32_cannot_hold():
    exact = np.array([[1.0, 2.5, -0.125]])
    assert reference_cache.compact(exact).dtype == np.float32
    assert reference_cache.compact(np.array([[0.1]])).dtype == np.float64


# ---------------------------------------------------------------------------
# the same tokens on both sides: a planted "\n\n" merge

MERGED = 77  # an id the planted tokenizer gives "\n\n" (the embedded vocabulary's last)


class MergeEngine(ShiftEngine):
    """The embedded model's logits (shift 0) behind a tokenizer that keeps "\\n\\n" as one token, as
    llama.cpp's pre-tokenizer does where transformers' splits it."""

    def encode(self, text, source="--prompt"):
        out = []
        for i, part in enumerate(text.split("\n\n")):
            if i:
                out.append(MERGED)
            out.extend(self.inner.encode(part, source) if part else [])
        return out

    def decode(self, ids):
        return "".join("\n\n" if int(i) == MERGED else self.inner.decode([i]) for i in ids)


@pytest.fixture
def merge_engine():
    registry.register("merge", MergeEngine)
    try:
        yield
    finally:
        registry.unregister("merge")


def test_finding_names_each_place_and_its_kind():
    nl, a, b = 0, 1, 2
    ref = [a, nl, nl, b, a, nl, nl, b, a]
    eng = [a, 9, b, a, 9, b, a]
    piece = {nl: "\n", a: "a", b: "b", 9: "\n\n"}.get
    f = token_agreement.finding(ref, eng, piece)
    assert (f["places"], f["reference_positions"], f["first_at"]) == (2, 4, 1)
    assert f["splits"][0]["places"] == 2 and f["splits"][0]["kind"].startswith("whitespace run")
    assert f["splits"][0]["reference"] == [ascii("\n"), ascii("\n")] and f["splits"][0]["engine"] == [ascii("\n\n")]
    assert token_agreement.finding(ref, ref, piece)["places"] == 0


def test_compare_engine_feeds_the_reference_ids_and_reports_the_merge(tmp_path, cache, merge_engine):
    text = tmp_path / "t.txt"
    text.write_text("ROMEO:\nBut soft.\n\nJULIET:\nGood night.\n\n" * 12)
    res = eexp.run(eexp.EnginesConfig(engines=["merge:0"], reference="embedded", text=str(text), tokens=120,
                                      steps=3, prompt="ROMEO:"))
    row = res.rows[0]
    body = text.read_text()[:121]  # the reference's 121 ids are its 121 characters
    assert row["tokens"].startswith("differ: the engine read the reference's ids")
    f = row["token_disagreement"]
    # every "\n\n" the reference's ids cover, except one cut by the end of the covered text
    assert f["places"] in (body.count("\n\n"), body.count("\n\n") - 1) and f["places"] >= 4
    assert f["first_at"] == body.index("\n\n")
    assert f["splits"][0]["kind"].startswith("whitespace run")
    # the engine read the reference's ids, so its logits are the reference's (shift 0): the comparison ran
    assert row["kld_mean"] <= 1e-9 and row["top1_agree_pct"] == 100.0 and row["greedy_diverged_at"] is None
    assert any("splits the text otherwise" in t for t in res.takeaways)


# ---------------------------------------------------------------------------
# the reference served from the cache


def test_second_run_reads_the_reference_from_the_cache_and_agrees(tmp_path, cache, monkeypatch):
    cfg = eexp.EnginesConfig(engines=["embedded"], reference="embedded", tokens=40, steps=4, prompt="ROMEO:")
    first = eexp.run(cfg)
    assert first.timing["reference_cache"] == "miss" and len(list(cache.glob("*.npz"))) == 2
    opened = []
    real = eexp.Reference.engine
    monkeypatch.setattr(eexp.Reference, "engine", lambda self: opened.append(1) or real(self))
    second = eexp.run(cfg)
    assert second.timing["reference_cache"] == "hit" and second.timing["reference_s"] == 0.0
    assert opened == []  # the reference was never loaded
    for k in ("kld_mean", "max_abs_diff", "greedy_diverged_at", "top1_agree_pct"):
        assert first.rows[0][k] == second.rows[0][k]
    assert first.reference == second.reference
    text = tmp_path / "t.txt"
    text.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 3)
    other = eexp.run(eexp.EnginesConfig(**{**cfg.__dict__, "text": str(text)}))
    assert other.timing["reference_cache"] == "miss"  # another text: its ids and logits are computed anew
    assert other.rows[0]["positions"] == 40 and len(list(cache.glob("*.npz"))) == 4
    off = eexp.run(eexp.EnginesConfig(**{**cfg.__dict__, "reference_cache": False}))
    assert off.timing["reference_cache"] == "off" and off.rows[0]["kld_mean"] == first.rows[0]["kld_mean"]


def test_other_steps_read_the_texts_logits_from_the_cache(cache):
    cfg = eexp.EnginesConfig(engines=["embedded"], reference="embedded", tokens=40, steps=4, prompt="ROMEO:")
    first = eexp.run(cfg)
    again = eexp.run(eexp.EnginesConfig(**{**cfg.__dict__, "steps": 6, "prompt": "JULIET:"}))
    # the greedy path is computed anew, the teacher-forced logits (which read the text alone) are not
    assert again.timing["reference_cache"] == "partly" and len(list(cache.glob("*.npz"))) == 3
    assert again.rows[0]["kld_mean"] == first.rows[0]["kld_mean"] and again.rows[0]["greedy_steps"] == 6


# ---------------------------------------------------------------------------
# llama.cpp: a session through its own KV cache


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    from helpers import cli, loaded_timeout

    out = tmp_path_factory.mktemp("gguf") / "m.gguf"
    r = cli("export", "embedded", "--to", "gguf:f32", "--out", str(out), timeout=loaded_timeout(300))
    assert r.code == 0, r.stderr
    return out


def test_llamacpp_session_matches_a_full_re_evaluation(gguf):
    """The prefill is the same eval (bit for bit); each decode step evaluates one token against the
    cache, through llama.cpp's single-row kernels: measured within 6.2e-6 of the full re-evaluation's
    logits (f32 cache), never bit-identical there. Bound: 1e-4, about 100 ulps of these logits (|x| < 32)."""
    import torch

    eng = registry.open_engine(f"llamacpp:{gguf},kv=f32,threads=1", "cpu")
    ids = eng.encode("ROMEO:\nBut soft, what light through yonder window breaks?")
    full = eng.logits(ids)
    assert np.array_equal(full, eng.logits(ids))  # run to run: the same bits
    feed = eng.session(None)
    prefill = feed(ids[:10]).numpy()
    steps = np.concatenate([feed([t]).numpy() for t in ids[10:]])
    assert np.array_equal(prefill.view(np.uint32), full[:10].view(np.uint32))
    assert np.isfinite(steps).all() and np.max(np.abs(full)) < 32
    assert np.max(np.abs(steps - full[10:])) <= 1e-4
    assert eng.info()["threads"] == 1
    assert isinstance(torch.get_num_threads(), int)


def test_llamacpp_forks_step_on_from_a_shared_prefix(gguf):
    """Two feeds forked from one prefix, stepping in turn (each rebuilding the context past the
    common prefix), give the logits a full evaluation of each's own tokens does, within the bound above."""
    eng = registry.open_engine(f"llamacpp:{gguf},kv=f32,threads=1", "cpu")
    assert eng.forks
    ids = eng.encode("ROMEO:\nBut soft, what light through yonder window breaks?")
    a = eng.session(None)
    a(ids[:20])
    b = eng.fork(a)
    tail_a, tail_b = ids[20:26], list(reversed(ids[20:26]))
    got_a = a(tail_a).numpy()
    got_b = b(tail_b).numpy()
    got_a2 = a(ids[26:28]).numpy()
    assert np.max(np.abs(got_a - eng.logits(ids[:26])[20:])) <= 1e-4
    assert np.max(np.abs(got_b - eng.logits(ids[:20] + tail_b)[20:])) <= 1e-4
    assert np.max(np.abs(got_a2 - eng.logits(ids[:28])[26:])) <= 1e-4


def test_external_engines_default_to_torch_threads(gguf):
    import torch

    eng = registry.open_engine(f"llamacpp:{gguf}", "cpu")
    assert eng.info()["threads"] == torch.get_num_threads()
    assert "n_threads" not in eng.info()
