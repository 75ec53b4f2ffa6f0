"""A TCP proxy that can stop forwarding, as a NAT or firewall that drops a connection silently does."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from types import TracebackType

from inferq.shared.redis_server import free_port


class FreezingProxy:
    """Forwards 127.0.0.1:<port> to ``target``; ``freeze()`` stops every connection open now, or every connection.

    A frozen connection stays open and reads nothing: its client's writes sit in kernel buffers and its reads
    wait for ever, which is what a peer that vanished without a FIN or RST looks like.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._frozen: set[socket.socket] = set()
        self._freeze_new = False
        self._lock = threading.Lock()
        self._closed = False
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, name="freezing-proxy", daemon=True)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def __enter__(self) -> FreezingProxy:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def freeze(self, *, new_too: bool = False) -> int:
        """Stop forwarding on every connection open now (and, with ``new_too``, on those opened later)."""
        with self._lock:
            self._frozen.update(self._peers)
            self._freeze_new = new_too
            return len(self._peers) // 2

    def thaw(self) -> None:
        """New connections are forwarded again; frozen ones stay frozen (as a NAT that lost their entries)."""
        with self._lock:
            self._freeze_new = False

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=5)
        for sock in [self._listener, *self._peers]:
            sock.close()

    def _run(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept()
                else:
                    self._forward(sock)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        upstream = socket.create_connection(self.target)
        with self._lock:
            self.accepted += 1
            self._peers[client], self._peers[upstream] = upstream, client
            if self._freeze_new:
                self._frozen.update((client, upstream))
        for sock in (client, upstream):
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, None)

    def _forward(self, sock: socket.socket) -> None:
        with self._lock:
            frozen = sock in self._frozen
            peer = self._peers.get(sock)
        if frozen or peer is None:
            if frozen:
                self._selector.unregister(sock)  # never read again: the kernel buffers fill, as with a dead peer
            return
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock, peer)
            return
        try:
            peer.setblocking(True)
            peer.sendall(data)
            peer.setblocking(False)
        except OSError:
            self._drop(sock, peer)

    def _drop(self, sock: socket.socket, peer: socket.socket) -> None:
        with self._lock:
            for s in (sock, peer):
                self._peers.pop(s, None)
                self._frozen.discard(s)
        for s in (sock, peer):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(s)
            s.close()
