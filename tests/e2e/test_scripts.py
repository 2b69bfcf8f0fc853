"""The scripts a user runs by hand: scripts/pg.sh keeps a cluster where it
was, so a URL written down once stays valid."""

from __future__ import annotations

import socket


def _leave_time_wait_on(port: int) -> None:
    """A connection to `port` whose server side closes first, as a server
    does when it stops with clients connected: the port is left in TIME_WAIT."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1)
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server side closes first: TIME_WAIT is on 127.0.0.1:port
    client.recv(1)
    client.close()
    listener.close()


def test_pg_sh_brings_a_stopped_cluster_back_on_its_port_despite_time_wait(pg_cluster):
    c = pg_cluster()
    first, port = c.url, c.port
    c.stop()
    _leave_time_wait_on(port)
    c.url, c.port = None, None  # no port given: pg.sh picks, as a user running it by hand
    assert c.start() == first, "the cluster came back on another port"
