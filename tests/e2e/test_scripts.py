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


def test_meson_install_puts_the_one_binary_in_the_prefix(outboxd_bin, tmp_path):
    """What the README says about installing: meson install stages
    <prefix>/bin/outboxd, and that binary runs on its own."""
    import os
    import subprocess
    build = os.path.dirname(outboxd_bin)
    r = subprocess.run(["meson", "install", "-C", build, "--no-rebuild", "--destdir", str(tmp_path), "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    installed = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()]
    assert installed == ["usr/local/bin/outboxd"], installed
    v = subprocess.run([str(tmp_path / "usr/local/bin/outboxd"), "--version"], capture_output=True, text=True)
    assert v.returncode == 0 and v.stdout.startswith("outboxd "), v
