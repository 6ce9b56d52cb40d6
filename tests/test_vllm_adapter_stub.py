"""The openai engine against a planted vLLM-shaped stub (issue 41; no vLLM
needed): /v1/models says owned_by "vllm", so the rows come from
prompt_logprobs by token id (row j is position j-1's distribution, the sent
id checked to be there) and greedy tokens from return_tokens_as_token_ids;
a row without the sent id is a one-line failure."""

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from precisionlab.engines.openai import VLLM, OpenAIEngine
from precisionlab.errors import RunError

# prompt_logprobs rows for the prompt [3, 1, 4]: row 0 null, row j holds the sent id ids[j] (and its rank)
ROWS = [None, {"1": {"logprob": -0.5, "rank": 1, "decoded_token": ""}, "2": {"logprob": -1.5, "rank": 2}},
        {"7": {"logprob": -0.25, "rank": 1}, "4": {"logprob": -2.0, "rank": 3}}]


@contextmanager
def stub(rows, owner="vllm"):
    bodies = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, doc):
            data = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send({"object": "list", "data": [{"id": "tiny", "owned_by": owner}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            if "prompt_logprobs" in body:
                self._send({"choices": [{"index": 0, "text": "", "prompt_logprobs": rows}]})
            else:  # greedy: the ids as vLLM spells them with return_tokens_as_token_ids
                toks = [f"token_id:{i}" for i in (5, 6, 7)][:body["max_tokens"]]
                self._send({"choices": [{"index": 0, "text": "", "logprobs": {
                    "tokens": toks, "token_logprobs": [-0.1] * len(toks), "top_logprobs": [None] * len(toks)}}]})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", bodies
    finally:
        srv.shutdown()
        srv.server_close()


def engine(url, top=2):
    eng = OpenAIEngine(f"{url},top={top},timeout=10", "cpu")
    eng.bind(lambda i: f"t{i}", 10)  # strings no answer uses: vLLM's rows are read by id
    return eng


def test_vllms_prompt_logprobs_are_read_by_id_one_position_late():
    with stub(ROWS) as (url, bodies):
        eng = engine(url)
        rows = eng.top_logprobs([3, 1, 4])
    assert rows == [{1: -0.5, 2: -1.5}, {7: -0.25, 4: -2.0}]
    assert bodies == [{"prompt": [3, 1, 4], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}]
    assert eng.info()["prompt_logprobs"] == VLLM and eng.info()["server"] == "vllm" and eng.echoes_prompt


def test_a_row_without_the_sent_id_is_one_line():
    bad = [None, {"2": {"logprob": -1.5}}, ROWS[2]]
    with stub(bad) as (url, _), pytest.raises(RunError, match=r"prompt_logprobs\[1\] does not hold the id 1 sent"):
        engine(url).top_logprobs([3, 1, 4])


def test_greedy_tokens_come_as_ids():
    with stub(ROWS) as (url, bodies):
        got = engine(url).generate([3, 1, 4], 3)
    assert got == [5, 6, 7]
    assert bodies[0]["return_tokens_as_token_ids"] is True and bodies[0]["max_tokens"] == 3
    assert bodies[0]["temperature"] == 0 and bodies[0]["ignore_eos"] is True


def test_another_server_is_not_read_as_vllm():
    with stub(ROWS, owner="me") as (url, _):
        eng = engine(url)
        assert not eng._is_vllm() and "server" not in eng.info()
