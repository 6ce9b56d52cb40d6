"""The one HTTP client of the project (the openai engine's and
`nondeterminism endpoint`'s): JSON in and out of the one server the user
named, a deadline for each whole request (not only each socket read), each
answer a dict or one RunError line, and close_all() to drop the connections in
flight (Ctrl-C). No adapter lives here, so an experiment may import it."""

from __future__ import annotations

import json
import threading

from precisionlab.errors import RunError, UsageError

MAX_TIMEOUT_S = 86400  # a day: past it the socket's and the timer's clocks overflow


def v1_base(url: str) -> str:
    """The user's URL as the API's base: `http://host:port` and `.../v1` both give `.../v1`."""
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"endpoint {url!r}: give the server's http:// or https:// URL")
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class Client:
    """JSON requests to one server (the user's URL, never another); thread-safe."""

    def __init__(self, base: str, timeout: float):
        from urllib.parse import urlsplit

        self.base = base
        self.timeout = timeout
        try:  # urlsplit and .port raise ValueError on '[::1' or a port past 65535
            parts = urlsplit(base)
            host, port = parts.hostname, parts.port
        except ValueError as e:
            raise UsageError(f"endpoint {base!r}: {e}") from None
        if not host:
            raise UsageError(f"endpoint {base!r}: no host in the URL")
        self._https = parts.scheme == "https"
        self._host, self._port, self._path = host, port, parts.path.rstrip("/")
        self._live: set = set()
        self._lock = threading.Lock()
        self.closed = False

    def get(self, path: str, timeout: float | None = None) -> dict:
        return self._request("GET", path, None, timeout)

    def post(self, path: str, body: dict, timeout: float | None = None) -> dict:
        return self._request("POST", path, body, timeout)

    def close_all(self) -> None:
        """Drop every connection in flight and refuse new ones: the server sees
        each request's client go away (what Ctrl-C must do)."""
        import socket

        with self._lock:
            self.closed = True
            live = list(self._live)
        for conn in live:
            try:
                for sock in {conn.sock, *getattr(conn, "held", [])} - {None}:  # conn.sock: None once answering
                    sock.shutdown(socket.SHUT_RDWR)
                conn.close()
            except OSError:
                pass

    def _request(self, method: str, path: str, body: dict | None, timeout: float | None) -> dict:
        """One request with a deadline for the whole of it: a socket timeout alone is per read, so a
        server sending a header line or a body byte a second never ran out of it; at the deadline a
        timer shuts the socket, and the read in progress ends."""
        import http.client

        # past a day, the socket's and the timer's clocks overflow (a traceback from the timer's thread)
        t = min(self.timeout if timeout is None else timeout, MAX_TIMEOUT_S)
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=t)
        url = self.base + path
        with self._lock:
            if self.closed:
                raise RunError(f"{url}: stopped")
            self._live.add(conn)
        expired = threading.Event()
        held: list = []  # the request's socket: http.client drops conn.sock once a closing answer began
        conn.held = held  # for close_all
        timer = threading.Timer(t, _expire, (held, expired))
        timer.daemon = True
        timer.start()
        try:
            conn.connect()
            held.append(conn.sock)
            if expired.is_set():  # the deadline passed while connecting
                raise TimeoutError
            doc = self._exchange(conn, method, path, body, url)
        except TimeoutError:
            raise RunError(f"{url}: no answer within {t:g} s (timeout)") from None
        except ConnectionRefusedError:
            raise RunError(f"{url}: connection refused (nothing listens there)") from None
        # RecursionError: an answer whose JSON nests deeper than Python's stack
        except (OSError, http.client.HTTPException, ValueError, RecursionError) as e:
            if expired.is_set():
                raise RunError(f"{url}: no answer within {t:g} s (timeout)") from None  # as a silent server's
            if self.closed:
                raise RunError(f"{url}: stopped") from None
            why = str(e).splitlines()[0] if str(e) else ""
            raise RunError(f"{url}: no usable answer ({type(e).__name__}{': ' + why if why else ''})") from None
        finally:
            timer.cancel()
            with self._lock:
                self._live.discard(conn)
            conn.close()
        if not isinstance(doc, dict):
            raise RunError(f"{url}: the answer is JSON but not an object")
        return doc

    def _exchange(self, conn, method: str, path: str, body: dict | None, url: str):
        """Send the request, read the whole answer: the JSON document, or RunError for an HTTP error."""
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, self._path + path, body=data,
                     headers={"Content-Type": "application/json"} if data else {})
        r = conn.getresponse()
        raw = r.read()
        if r.status != 200:
            text = raw.decode("utf-8", "replace").strip().splitlines()
            raise RunError(f"{url}: HTTP {r.status} {r.reason}" + (f": {text[0][:200]!r}" if text else ""))
        return json.loads(raw.decode("utf-8"))


def _expire(held: list, expired: threading.Event) -> None:
    """The request's deadline: mark it, and shut its socket so the read in progress returns."""
    import socket

    expired.set()
    for sock in list(held):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
