"""Python implementations of the SDK's foreign traits, as an app would write them."""

import gzip
import http.client
import json
import socket
import threading
import urllib.parse

import eventspool


class HttpClientTransport(eventspool.HttpTransport):
    """An app's own HTTP stack (here the standard library's http.client): it sends what it is
    given, returns whatever status came back, and maps "no answer" onto HttpTransportError."""

    def __init__(self):
        self.calls = 0
        self.lock = threading.Lock()

    def send(self, request):
        with self.lock:
            self.calls += 1
        url = urllib.parse.urlsplit(request.url)
        # http.client's timeout is per socket operation: the SDK's "no byte moved" timeout.
        stall_ms = request.stall_timeout_ms or request.timeout_ms
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=stall_ms / 1000)
        try:
            conn.request(request.method, url.path or "/", body=bytes(request.body), headers=dict(request.headers))
            response = conn.getresponse()
            return eventspool.TransportResponse(
                status=response.status,
                headers={k: v for k, v in response.getheaders()},
                body=response.read(64 * 1024),
            )
        except ConnectionRefusedError as e:
            raise eventspool.HttpTransportError.Connect(str(e))
        except socket.timeout:
            raise eventspool.HttpTransportError.Timeout()
        except OSError as e:
            raise eventspool.HttpTransportError.Io(str(e))
        finally:
            conn.close()


class FlakyTransport(HttpClientTransport):
    """Throws an undeclared exception for the first `failures` calls, then behaves."""

    def __init__(self, failures):
        super().__init__()
        self.failures = failures

    def send(self, request):
        with self.lock:
            self.failures -= 1
            failing = self.failures >= 0
        if failing:
            raise ValueError("the app's HTTP stack blew up")
        return super().send(request)


class RejectingTransport(HttpClientTransport):
    """Plays a collector that refuses events named `poison` (a 200 with a `rejected` list)
    while `rejecting` is set, and forwards everything else to the real collector."""

    def __init__(self):
        super().__init__()
        self.rejecting = True

    def send(self, request):
        body = bytes(request.body)
        if any(k.lower() == "content-encoding" and v == "gzip" for k, v in request.headers.items()):
            body = gzip.decompress(body)
        envelope = json.loads(body)
        poison = [e["event_id"] for e in envelope["batch"] if e["name"] == "poison"]
        if not (self.rejecting and poison):
            return super().send(request)
        # The rest of the batch goes to the real collector; the poison is refused in the answer.
        envelope["batch"] = [e for e in envelope["batch"] if e["name"] != "poison"]
        if envelope["batch"]:
            headers = {k: v for k, v in request.headers.items() if k.lower() != "content-encoding"}
            forwarded = eventspool.TransportRequest(
                method=request.method, url=request.url, headers=headers,
                body=json.dumps(envelope).encode(), timeout_ms=request.timeout_ms,
            )
            upstream = super().send(forwarded)
            if upstream.status != 200:
                return upstream
        rejected = [{"event_id": i, "reason": "schema: poison is not allowed"} for i in poison]
        return eventspool.TransportResponse(status=200, headers={}, body=json.dumps({"rejected": rejected}).encode())


class Recorder(eventspool.DeliveryObserver):
    """Keeps every status it is told about."""

    def __init__(self):
        self.statuses = []
        self.notices = []
        self.lock = threading.Lock()

    def on_state(self, status):
        with self.lock:
            self.statuses.append(status)

    def on_notice(self, notice):
        with self.lock:
            self.notices.append(notice)

    def states(self):
        with self.lock:
            return [s.state for s in self.statuses]


class ThrowingObserver(eventspool.DeliveryObserver):
    def __init__(self):
        self.calls = 0

    def on_state(self, status):
        self.calls += 1
        raise RuntimeError("observer bug")

    def on_notice(self, notice):
        raise RuntimeError("observer bug")
