"""A TCP proxy in front of Redis that can lose its replies or delay requests.

A command sent through it while ``drop_replies`` is set reaches Redis and runs,
but its reply never comes back: what a client sees when a reply is lost on
the way (a stalled network, a server that hung right after answering). With
``request_delay`` set, what the client sends reaches Redis that many seconds
late: a lossy link, where the kernel keeps retransmitting after the client
gave up and closed. Either way the client times out not knowing whether (or
when) its command takes effect.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class ReplyDroppingProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.drop_replies = False
        self.request_delay = 0.0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def close(self) -> None:
        self._closed = True
        for sock in [self.listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if replies and self.drop_replies:
                    continue
                if not replies and self.request_delay:
                    threading.Timer(self.request_delay, self._send_late, (sink, data)).start()
                    continue
                sink.sendall(data)

    @staticmethod
    def _send_late(sink: socket.socket, data: bytes) -> None:
        with contextlib.suppress(OSError):
            sink.sendall(data)
