"""nondeterminism --endpoint against stub servers written here: http.server on
127.0.0.1 (port 0, the kernel picks), in a thread this test starts and stops,
answering a bounded number of requests with fixed completions and log-probs,
so every expected figure (k, the parting position, its margin, the spread)
is known before the run. The real server is tests/test_endpoint_server.py."""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import ROOT, cli, json_glossary_problems, loaded_timeout, strict_json

from precisionlab.engines.http_client import Client
from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import endpoint as ep

# One completion: its tokens, each token's log-prob and the top-2 there.
KING = ([" the", " king"], [-0.25, -0.6931], [{" the": -0.25, " a": -1.75}, {" king": -0.6931, " queen": -0.7031}])
QUEEN = ([" the", " queen"], [-0.25, -0.7031], [{" the": -0.25, " a": -1.75}, {" queen": -0.7031, " king": -0.6931}])


def legacy(tokens, lps, tops):
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": list(range(len(tokens)))}


def content(tokens, lps, tops):
    """llama-server's form: one object a token, its top-K as a list."""
    return {"content": [{"token": t, "logprob": lp, "top_logprobs": [{"token": k, "logprob": v} for k, v in top.items()]}
                        for t, lp, top in zip(tokens, lps, tops, strict=True)]}


class Stub:
    """answer(i, body) -> (text, logprobs-object) for the i-th completion request;
    "hang" makes the handler wait (for the client to go, or the test to end)."""

    def __init__(self, answer, owned_by="me", max_requests=400):
        self.answer, self.owned_by, self.max_requests = answer, owned_by, max_requests
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.client_gone = threading.Event()
        self.arrived = threading.Event()


def _handler(stub: Stub):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, doc, status=200):
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client left (the time limit, a failure)
                pass

        def do_GET(self):
            if self.path == "/v1/models":
                self._send({"object": "list", "data": [{"id": "stub-model", "owned_by": stub.owned_by}]})
            else:
                self._send({"error": "no such route"}, 404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with stub.lock:
                i = len(stub.bodies)
                stub.bodies.append(body)
            assert i < stub.max_requests, "the client sent more requests than it was asked to"
            stub.arrived.set()
            got = stub.answer(i, body)
            if got == "hang":
                self.connection.settimeout(0.05)
                while not stub.released.is_set():
                    try:
                        if self.connection.recv(1) == b"":
                            stub.client_gone.set()
                            return
                    except TimeoutError:
                        continue
                    except OSError:
                        stub.client_gone.set()
                        return
                return
            text, lp = got
            self._send({"id": f"cmpl-{i}", "object": "text_completion", "model": "stub-model",
                        "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": "length"}]})

    return H


@contextmanager
def serve(stub: Stub):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        stub.released.set()
        srv.shutdown()
        srv.server_close()
        t.join(5)


def fixed(i, body):
    return "".join(KING[0]), legacy(*KING)


def alternating(i, body):
    k = KING if i % 2 == 0 else QUEEN
    return "".join(k[0]), legacy(*k)


def test_a_deterministic_stub_gives_one_completion_of_n_with_identical_log_probs():
    stub = Stub(fixed)
    with serve(stub) as url:
        res = ep.run(ep.EndpointConfig(url=url, prompt="p", requests=8, concurrency=3, cache="server"))
    assert [(r["stream"], r["concurrency"]) for r in res.rows] == [("sequential", 1), ("concurrent", 3)]
    for r in res.rows:
        assert r["unique"] == 1 and r["answered"] == 8 and r["complete"]
        assert r["counts"] == [{"text": " the king", "count": 8}]
        assert r["first_parting_token"] is None and r["distinct_logprobs"] == 1
        assert r["logprob_spread"] == [0.0, 0.0] and r["max_logprob_spread"] == 0.0
    assert len(stub.bodies) == 16 and all(b["temperature"] == 0 and b["logprobs"] == 2 for b in stub.bodies)
    assert all("cache_prompt" not in b and b["model"] == "stub-model" for b in stub.bodies)


@pytest.mark.parametrize("form", [legacy, content])
def test_a_stub_alternating_two_texts_gives_two_parting_at_the_second_token(form):
    def answer(i, body):
        k = KING if i % 2 == 0 else QUEEN
        return "".join(k[0]), form(*k)

    with serve(Stub(answer)) as url:
        res = ep.run(ep.EndpointConfig(url=url, prompt="p", requests=6, concurrency=1, cache="server"))
    (r,) = res.rows
    assert r["unique"] == 2 and sorted(c["count"] for c in r["counts"]) == [3, 3]
    assert r["first_parting_token"] == 1 and r["parting_tokens"] == [" king", " queen"]
    # both completions have top-1 - top-2 = -0.6931 - -0.7031 there (in either order)
    assert r["parting_margin"] == pytest.approx(0.01, abs=1e-12)
    assert r["logprob_spread"] == [0.0]  # the common prefix: position 0 only


def test_the_spread_is_the_exact_max_minus_min_of_a_position():
    jitter = 2.0 ** -10  # exact in binary: the spread must come out as this, to the bit

    def answer(i, body):
        lps = [-0.25 - (jitter if i % 3 == 0 else 0.0), -0.6931]
        return " the king", legacy(KING[0], lps, KING[2])

    with serve(Stub(answer)) as url:
        res = ep.run(ep.EndpointConfig(url=url, prompt="p", requests=6, concurrency=2, cache="server"))
    for r in res.rows:
        assert r["unique"] == 1 and r["distinct_logprobs"] == 2
        assert r["logprob_spread"] == [jitter, 0.0] and r["max_spread_position"] == 0


def test_cache_on_and_off_send_llama_cpps_field_and_say_whether_it_is_known():
    stub = Stub(fixed)
    with serve(stub) as url:
        res = ep.run(ep.EndpointConfig(url=url, prompt="p", requests=3, concurrency=1, cache="on,off"))
    assert [r["cache"] for r in res.rows] == ["on", "off"]
    assert [b["cache_prompt"] for b in stub.bodies] == [True] * 3 + [False] * 3
    assert res.params["cache_switch"].startswith("unknown") and "'me'" in res.params["cache_switch"]
    with serve(Stub(fixed, owned_by="llamacpp")) as url:
        res = ep.run(ep.EndpointConfig(url=url, prompt="p", requests=1, concurrency=1, cache="on"))
    assert res.params["cache_switch"].startswith("llama.cpp's cache_prompt")


def test_mixed_runs_interleave_the_other_prompts_and_count_only_the_prompt():
    def answer(i, body):
        if body["prompt"] == "p":
            return fixed(i, body)
        return f"other {i}", legacy([f" o{i}"], [-1.0], [{f" o{i}": -1.0, " x": -2.0}])

    stub = Stub(answer)
    with serve(stub) as url:
        res = ep.run(ep.EndpointConfig(url=url, prompt="p", requests=4, concurrency=2, mix=True,
                                       other_prompts=["q1", "q2"], cache="server"))
    mixed = res.rows[-1]
    assert mixed["stream"] == "mixed" and mixed["unique"] == 1 and mixed["answered"] == 4
    prompts = [b["prompt"] for b in stub.bodies[-8:]]
    assert sorted(prompts) == ["p"] * 4 + ["q1", "q1", "q2", "q2"]


def test_a_hanging_stub_is_a_bounded_one_line_failure():
    stub = Stub(lambda i, body: "hang")
    with serve(stub) as url:
        t0 = time.monotonic()
        with pytest.raises(RunError, match=r"no answer within 0\.5 s \(timeout\)"):
            ep.run(ep.EndpointConfig(url=url, prompt="p", requests=4, concurrency=2, request_timeout=0.5))
        assert time.monotonic() - t0 < loaded_timeout(5)
        r = cli("nondeterminism", "endpoint", url, "--requests", "3", "--request-timeout", "1",
                timeout=loaded_timeout(60))
    assert r.code == 1 and r.out == ""
    assert r.err.count("\n") == 1 and "no answer within 1 s (timeout)" in r.err and "Traceback" not in r.err


def test_the_time_limit_stops_the_run_with_what_it_has():
    def slow(i, body):
        time.sleep(0.2)
        return fixed(i, body)

    stub = Stub(slow)
    with serve(stub) as url:
        t0 = time.monotonic()
        res = ep.run(ep.EndpointConfig(url=url, prompt="p", requests=50, concurrency=2, time_limit=1.0,
                                       cache="server"))
        took = time.monotonic() - t0
    assert took < loaded_timeout(4)  # 1 s, plus at most one request's end and the slack of the wait
    # the time is planned per run (issue 41): the sequential run gets half, the concurrent run the rest; neither
    # is skipped, both stop at their share with what they have
    assert [r["stream"] for r in res.rows] == ["sequential", "concurrent"] and res.params["skipped"] == []
    seq, conc = res.rows
    assert math.isclose(seq["budget_s"], 0.5, rel_tol=0.2) and conc["budget_s"] > 0
    for r in res.rows:
        assert not r["complete"] and 0 < r["answered"] < 50 and r["unique"] == 1
    assert len(stub.bodies) < 100
    assert any("share of the 1 s time limit" in t for t in res.takeaways)


def test_cache_server_sends_nothing_and_says_so():
    stub = Stub(fixed)
    with serve(stub) as url:
        res = ep.run(ep.EndpointConfig(url=url, prompt="p", requests=2, concurrency=1, cache="server"))
    assert all("cache_prompt" not in b for b in stub.bodies)
    assert "cache_prompt sent" not in res.params["cache_switch"] and res.params["cache_switch"].startswith("none sent")


def test_vllm_ignores_cache_prompt_so_on_and_off_are_one_server_run():
    stub = Stub(fixed, owned_by="vllm")
    with serve(stub) as url:
        res = ep.run(ep.EndpointConfig(url=url, prompt="p", requests=2, concurrency=2, cache="on,off"))
    assert [(r["stream"], r["cache"]) for r in res.rows] == [("sequential", "server"), ("concurrent", "server")]
    assert all("cache_prompt" not in b for b in stub.bodies) and len(stub.bodies) == 4
    assert "--enable-prefix-caching" in res.params["cache_switch"] and res.params["caches_asked"] == ["on", "off"]
    assert res.takeaways[0].startswith("--cache on,off ran as one 'server' run")


def test_a_stub_without_logprobs_is_one_line():
    stub = Stub(lambda i, body: ("text", None))
    with serve(stub) as url:
        r = cli("nondeterminism", "endpoint", url, "--requests", "5", timeout=loaded_timeout(60))
    assert r.code == 1 and r.err.count("\n") == 1
    assert "returned no logprobs (choices[0].logprobs is null)" in r.err
    assert len(stub.bodies) <= 4  # the first answer ends it (at most the ones already in flight)


def test_a_server_that_does_not_listen_is_one_line_and_options_are_checked_first():
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = cli("nondeterminism", "endpoint", f"http://127.0.0.1:{port}", timeout=loaded_timeout(60))
    assert r.code == 1 and r.err.count("\n") == 1 and "does not answer" in r.err and "connection refused" in r.err
    r = cli("nondeterminism", "endpoint", f"http://127.0.0.1:{port}", "--sections", "atomics",
            timeout=loaded_timeout(60))
    assert r.code == 2 and "No such option: --sections" in r.err and r.err.count("\n") == 1
    r = cli("nondeterminism", "--concurrency", "2", timeout=loaded_timeout(60))
    assert r.code == 2 and "No such option: --concurrency" in r.err
    url = f"http://127.0.0.1:{port}"
    for kw, msg in (({"requests": 0}, "--requests must be in 1"), ({"cache": "maybe"}, "maybe"),
                    ({"other_prompts": ["x"]}, "add --mix"), ({"time_limit": float("nan")}, "--time-limit"),
                    ({"url": "ftp://x"}, "http://")):
        with pytest.raises(UsageError, match=msg):
            ep.check(ep.EndpointConfig(**{"url": url, "prompt": "p", **kw}))


def test_json_rows_and_table_against_the_alternating_stub():
    with serve(Stub(alternating)) as url:
        r = cli("nondeterminism", "endpoint", url, "--requests", "4", "--concurrency", "2", "--cache", "off",
                "--json", timeout=loaded_timeout(60))
        t = cli("nondeterminism", "endpoint", url, "--requests", "4", "--concurrency", "1", "--cache", "off",
                timeout=loaded_timeout(60))
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["command"] == "nondeterminism endpoint" and json_glossary_problems(doc) == []
    assert [row["unique"] for row in doc["rows"]] == [2, 2]
    assert all(row["first_parting_token"] == 1 for row in doc["rows"])
    assert t.code == 0 and "2 of 4" in t.out and "' queen'" in t.out


def test_close_all_ends_a_request_in_flight():
    stub = Stub(lambda i, body: "hang")
    with serve(stub) as url:
        client = Client(url + "/v1", timeout=30)
        errors = []

        def post():
            try:
                client.post("/completions", {"prompt": "p"})
            except RunError as e:
                errors.append(str(e))

        th = threading.Thread(target=post)
        th.start()
        assert stub.arrived.wait(10)
        t0 = time.monotonic()
        client.close_all()
        th.join(10)
        assert not th.is_alive() and time.monotonic() - t0 < 5
        assert errors and "stopped" in errors[0]
        assert stub.client_gone.wait(5)  # the server saw its client go


def test_ctrl_c_stops_the_requests_in_flight():
    stub = Stub(lambda i, body: "hang")
    with serve(stub) as url:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("PRECISIONLAB_DEBUG", None)
        p = subprocess.Popen([sys.executable, "-m", "precisionlab", "nondeterminism", "endpoint", url,
                              "--requests", "3", "--request-timeout", "60"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert stub.arrived.wait(loaded_timeout(30))
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=loaded_timeout(10))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode == 130 and "Traceback" not in err
        assert stub.client_gone.wait(5)
