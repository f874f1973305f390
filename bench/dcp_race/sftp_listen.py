#!/usr/bin/env python3
"""An inetd for OpenSSH's sftp-server: listens on ADDRESS:PORT and serves
each connection with its own `sftp-server -d ROOT` whose standard input and
output are the connection (the way sshd runs it, without ssh: no encryption,
like NFS without Kerberos). Runs until killed.

    sftp_listen.py ADDRESS PORT ROOT
"""

import signal
import socket
import subprocess
import sys

SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def main(address, port, root):
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the servers
    with socket.create_server((address, int(port)), backlog=64) as srv:
        while True:
            conn, _ = srv.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            subprocess.Popen([SFTP_SERVER, "-d", root], stdin=conn, stdout=conn,
                             stderr=subprocess.DEVNULL, close_fds=True)
            conn.close()  # the server holds its own copy


if __name__ == "__main__":
    main(*sys.argv[1:])
