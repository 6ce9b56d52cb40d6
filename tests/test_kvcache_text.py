"""kvcache --text: the calibrated scales are measured on the user's text, not the shipped Shakespeare."""

import json

from helpers import cli

TEXT = "KING HENRY:\nWhat says the herald? Let him speak, and speak it loud and plain!\n"


def test_kvcache_calibrates_on_the_users_text(tmp_path):
    f = tmp_path / "cal.txt"
    f.write_text(TEXT)
    r = cli("kvcache", "--steps", "3", "--scales", "calibrated", "--dtypes", "fp8_e4m3", "--text", str(f), "--json")
    assert r.code == 0, r.err
    params = json.loads(r.out)["params"]
    # the embedded model's tokens are its characters: the whole (short) text, not 512 characters of Shakespeare
    assert params["calibration_tokens"] == len(TEXT) and params["text"] == str(f)


def test_kvcache_text_refusals(tmp_path):
    for args, says in ((("--text", str(tmp_path / "none.txt")), "no such file"), (("--text", ""), "is empty")):
        r = cli("kvcache", "--steps", "3", *args)
        assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err
