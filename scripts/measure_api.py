# What the measure-*.py scripts share: HTTP requests over a VMM's Unix API socket (exitless's
# and Cloud Hypervisor's /api/v1/..., Firecracker's /...), each timed from the client.
import http.client, json, socket, time


class Unix(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__('localhost', timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


def request(sock, method, path, body=None, timeout=60):
    """One request on the API socket `sock`: (status, body, ms); a status of 300 or more
    raises, naming the request and the answer."""
    c = Unix(sock, timeout)
    t0 = time.perf_counter()
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={'Content-Type': 'application/json'} if body is not None else {})
    r = c.getresponse()
    data = r.read()
    ms = (time.perf_counter() - t0) * 1e3
    c.close()
    if r.status >= 300:
        raise RuntimeError(f'{method} {path}: {r.status} {data!r}')
    return r.status, data, ms
