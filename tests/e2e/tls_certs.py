"""Throwaway certificates for HTTPS tests, made with the ``openssl`` CLI.

``make_tls_files(directory)`` writes, into ``directory``:

* a CA (``ca.pem``, the file to trust: ``--ca-file``),
* a server certificate signed by it for ``localhost``, 127.0.0.1 and ::1
  (``server.pem`` / ``server.key``),
* a server certificate signed by the same CA for ``wrong.example`` only
  (``wrong.pem`` / ``wrong.key``): valid chain, wrong name.

Keys are ECDSA P-256 without a passphrase; certificates are valid from an
hour ago for two days (clock skew between the test and the TLS stack never
matters). Standalone check: ``/usr/bin/python3 tests/e2e/tls_certs.py``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TlsFiles", "make_tls_files"]


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path      # trust this (--ca-file)
    server_cert: Path  # localhost, 127.0.0.1, ::1
    server_key: Path
    wrong_cert: Path   # wrong.example only
    wrong_key: Path

    @property
    def server(self) -> tuple:
        """(certfile, keyfile) for Receiver(tls=...)."""
        return str(self.server_cert), str(self.server_key)

    @property
    def wrong_host(self) -> tuple:
        """(certfile, keyfile) of the certificate for another name."""
        return str(self.wrong_cert), str(self.wrong_key)


def _openssl(*args, cwd: Path) -> None:
    p = subprocess.run(["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(map(str, args))} failed (rc={p.returncode}):\n{p.stderr}")


def _new_key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name, cwd=cwd)


def _issue(name: str, common_name: str, subject_alt_names: str, serial: int, cwd: Path) -> None:
    """name.key + name.pem, signed by ca.key/ca.pem."""
    _new_key(f"{name}.key", cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN={common_name}", "-out", f"{name}.csr", cwd=cwd)
    (cwd / f"{name}.ext").write_text(
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature\n"
        "extendedKeyUsage = serverAuth\n"
        f"subjectAltName = {subject_alt_names}\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-set_serial", serial, "-days", "2", "-sha256", "-extfile", f"{name}.ext",
             "-out", f"{name}.pem", cwd=cwd)


def make_tls_files(directory) -> TlsFiles:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _new_key("ca.key", d)
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=outboxd e2e test CA",
             "-days", "2", "-sha256",
             "-addext", "basicConstraints = critical, CA:TRUE",
             "-addext", "keyUsage = critical, keyCertSign, cRLSign",
             "-out", "ca.pem", cwd=d)
    _issue("server", "localhost", "DNS:localhost, IP:127.0.0.1, IP:::1", 2, d)
    _issue("wrong", "wrong.example", "DNS:wrong.example", 3, d)
    return TlsFiles(ca_cert=d / "ca.pem", server_cert=d / "server.pem", server_key=d / "server.key",
                    wrong_cert=d / "wrong.pem", wrong_key=d / "wrong.key")


if __name__ == "__main__":
    import ssl
    import tempfile

    with tempfile.TemporaryDirectory(prefix="outboxd-tls-") as tmp:
        files = make_tls_files(tmp)
        for cert, key in (files.server, files.wrong_host):  # keys match their certificates
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
        # Both chain to the CA; only one is for localhost.
        for cert, ok in ((files.server_cert, True), (files.wrong_cert, False)):
            out = subprocess.run(["openssl", "verify", "-CAfile", files.ca_cert, "-verify_hostname", "localhost",
                                  cert], capture_output=True, text=True)
            assert (out.returncode == 0) == ok, (cert, out.stdout, out.stderr)
            chain = subprocess.run(["openssl", "verify", "-CAfile", files.ca_cert, cert],
                                   capture_output=True, text=True)
            assert chain.returncode == 0, (cert, chain.stderr)
    print("tls_certs self-test ok")
