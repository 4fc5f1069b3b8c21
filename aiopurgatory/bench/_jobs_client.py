"""The load client of ``aiopurgatory bench jobs``, a process of its own (its CPU apart).

``python -m aiopurgatory.bench._jobs_client PORT`` reads task ids (one a line) on
stdin until an empty line, opens one connection per id and sends
``GET /wait/<id>``, prints ``parked`` once every request is sent, then reads
every answer with one selector (raw sockets: an HTTP client library would spend
the CPU the servers need) and prints one JSON line: ``{id: [answered_at, body]}``,
``answered_at`` being ``time.time()`` when the whole answer had arrived.
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import sys
import time


def main() -> None:
    port = int(sys.argv[1])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    ids = []
    for line in sys.stdin:
        if not line.strip():
            break
        ids.append(line.strip())
    selector = selectors.DefaultSelector()
    received: dict[socket.socket, bytearray] = {}
    names: dict[socket.socket, str] = {}
    for task_id in ids:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            f"GET /wait/{task_id} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n".encode()
        )
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        received[sock] = bytearray()
        names[sock] = task_id
    print("parked", flush=True)
    answers: dict[str, tuple[float, str]] = {}
    while len(answers) < len(ids):
        for key, _ in selector.select(timeout=1.0):
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            sock = ready
            data = sock.recv(65536)
            if data:
                received[sock] += data
                continue
            now = time.time()
            selector.unregister(sock)
            sock.close()
            body = bytes(received[sock]).partition(b"\r\n\r\n")[2].decode()
            answers[names[sock]] = (now, body)
    print(json.dumps(answers), flush=True)


if __name__ == "__main__":
    main()
