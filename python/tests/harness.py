"""Starts a real crescent-master and crescent-client (bin/, `make build`)
on free loopback ports for the Python tests, and stops them."""

import os
import re
import queue
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(REPO, "bin")
PYTHON = os.path.join(REPO, "python")


def _admin_token_file():
    """The test masters' admin token (--admin_token_file), also handed to
    every Store of this process and its children through the library's
    CRESCENT_ADMIN_TOKEN_FILE, as a deployment would."""
    import atexit
    import secrets
    import tempfile
    fd, path = tempfile.mkstemp(prefix="crescent-admin-")
    os.write(fd, secrets.token_hex(16).encode())
    os.close(fd)  # mkstemp makes it 0600, as --admin_token_file requires
    atexit.register(os.unlink, path)
    return path


ADMIN_TOKEN_FILE = _admin_token_file()
os.environ["CRESCENT_ADMIN_TOKEN_FILE"] = ADMIN_TOKEN_FILE
sys.path.insert(0, PYTHON)
os.environ.setdefault("CRESCENT_LIB", os.path.join(REPO, "build", "libcrescent.so"))


def _wait_line(proc, stream, pattern, timeout=30):
    """Reads proc's stream (on a thread that keeps draining it, so a
    chatty process never blocks on a full pipe) until a line matches
    pattern; returns the match."""
    lines = queue.Queue()

    def pump():
        try:
            for x in stream:
                lines.put(x)
        except (ValueError, OSError):  # closed by Cluster.stop
            pass
        lines.put(None)
    threading.Thread(target=pump, daemon=True).start()
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            threading.Thread(target=lambda: [None for _ in iter(lines.get, None)], daemon=True).start()
            return m
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{proc.args[0]}: no line matching {pattern!r} in:\n{''.join(seen)}")


class Cluster:
    """A master and (clients > 0) crescent-client daemons contributing
    segment bytes each."""

    def __init__(self, clients=1, segment="64MiB", client_args=(), client_env=None):
        self.procs = []
        m = subprocess.Popen([os.path.join(BIN, "crescent-master"), "--rpc_address", "127.0.0.1", "--rpc_port", "0",
                              "--metrics_port", "0", "--admin_token_file", ADMIN_TOKEN_FILE], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.procs.append(m)
        self.master = _wait_line(m, m.stderr, r"rpc=(127\.0\.0\.1:\d+)").group(1)
        try:
            self._start_clients(clients, segment, client_args, client_env)
        except BaseException:
            self.stop()
            raise

    def _start_clients(self, clients, segment, client_args, client_env):
        for _ in range(clients):
            c = subprocess.Popen([os.path.join(BIN, "crescent-client"), "--master_server_address", self.master,
                                  "--global_segment_size", segment, "--local_buffer_size", "16MiB",
                                  "--metrics_port", "0", "--metrics_address", "127.0.0.1",
                                  "--local_hostname", "127.0.0.1", "--admin_token_file", ADMIN_TOKEN_FILE,
                                  *client_args],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=None if client_env is None else {**os.environ, **client_env})
            self.procs.append(c)
            _wait_line(c, c.stdout, r"metrics on")

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()
