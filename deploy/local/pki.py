#!/usr/bin/env python3
"""A throwaway certificate authority made with Debian's openssl.

The one place the Python side (deploy/local, the Python test suites) makes
certificates. Pki(dir) creates a CA in `dir`; issue(common_name) signs a
certificate whose common name is the reshard identity ("agent:host-0",
"admin:local", "coordinator") with SANs localhost and 127.0.0.1, so any of
them can also serve on loopback. Keys are EC P-256, valid for 2 days, mode
0600 in a 0700 directory. See docs/security.md.
"""

import os
import re
import subprocess
import threading


class PkiError(RuntimeError):
    """openssl failed or is missing."""


def _openssl(*args):
    try:
        r = subprocess.run(["openssl", *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise PkiError("openssl not found: install Debian's openssl (scripts/bootstrap.sh)") from None
    if r.returncode != 0:
        raise PkiError(f"openssl {' '.join(args)} failed: {r.stderr.strip()}")


def _stem(common_name):
    return re.sub(r"[^A-Za-z0-9]", "_", common_name)


class Pki:
    """A CA in `directory` (created). Attributes: dir, ca (the CA certificate)."""

    def __init__(self, directory, name="reshard-local"):
        self.dir = os.path.abspath(directory)
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.ca = os.path.join(self.dir, "ca.pem")
        self._ca_key = os.path.join(self.dir, "ca.key")
        self._issued = {}
        self._serial = 0
        self._lock = threading.Lock()
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", self._ca_key, "-out", self.ca, "-days", "2",
                 "-subj", f"/CN={name}-ca")

    def issue(self, common_name, reissue=False, ips=()):
        """(cert, key) paths of a certificate for `common_name`, issued once
        (again with reissue=True: a new key, the same paths, replaced atomically).
        Its subjectAltName holds localhost, 127.0.0.1 and every address in `ips`."""
        with self._lock:
            if common_name in self._issued and not reissue:
                return self._issued[common_name]
            self._serial += 1
            stem = os.path.join(self.dir, _stem(common_name))
            tag = f".{self._serial}"
            ext = stem + tag + ".ext"
            with open(ext, "w") as f:
                f.write("basicConstraints=CA:FALSE\n"
                        "keyUsage=digitalSignature,keyEncipherment\n"
                        "extendedKeyUsage=serverAuth,clientAuth\n"
                        "subjectAltName=DNS:localhost,IP:127.0.0.1%s\n"
                        % "".join(",IP:" + ip for ip in ips if ip != "127.0.0.1"))
            key, csr, cert = stem + tag + ".key", stem + tag + ".csr", stem + tag + ".pem"
            _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                     "-keyout", key, "-out", csr, "-subj", f"/CN={common_name}")
            _openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self._ca_key,
                     "-set_serial", str(1000 + self._serial), "-days", "2", "-extfile", ext,
                     "-out", cert)
            os.chmod(key, 0o600)
            out = (stem + ".pem", stem + ".key")
            os.replace(key, out[1])
            os.replace(cert, out[0])
            for leftover in (ext, csr):
                os.unlink(leftover)
            self._issued[common_name] = out
            return out

    def coordinator_flags(self, common_name="coordinator", ips=()):
        """--tls-cert/--tls-key/--tls-ca of a server (coordinator) or agent;
        `ips`: the addresses a server is reached at, besides 127.0.0.1."""
        cert, key = self.issue(common_name, ips=ips)
        return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", self.ca]

    def env(self, common_name):
        """RESHARD_TLS_* variables of a client (reshardctl, the C++ quickstart)."""
        cert, key = self.issue(common_name)
        return {"RESHARD_TLS_CA": self.ca, "RESHARD_TLS_CERT": cert, "RESHARD_TLS_KEY": key}
