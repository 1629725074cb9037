"""A throwaway PostgreSQL server for the tests.

The server binaries come from the distribution (Debian's ``postgresql`` package, installed
with apt-get when they are missing and we are root). The cluster lives in a fresh
temporary directory and listens only on a unix socket inside it, with trust
authentication: the directory is private to its owner, so no password exists anywhere
(argv, logs or URL). Stopping removes the directory.

PostgreSQL refuses to run as root, so under root the cluster belongs to the ``postgres``
system user (made by the Debian package) and every server command runs as that user.

    python -m tests.helpers.postgres install   # the binaries (make test, before pytest)
    python -m tests.helpers.postgres run       # a server until Ctrl-C; prints its URL
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = (
    "install PostgreSQL's server (Debian/Ubuntu: `sudo apt-get install postgresql`), "
    "or set GPUFLOW_TEST_POSTGRES_URL to a PostgreSQL database the tests may wipe"
)
SUPERUSER = "gpuflow"  # the cluster's superuser; trust auth, so it has no password
DATABASE = "gpuflow_test"
PORT = 5432  # only names the socket file: the socket directory is private to this server
DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"
INSTALL_LOG = Path(tempfile.gettempdir()) / "gpuflow-postgres-install.log"
# Durability is worth nothing for a server that lives one test session: trade it for speed.
SETTINGS = {
    "listen_addresses": "''",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",  # each test process keeps a small pool open
}


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be installed or started here; the message says why."""


def find_bindir() -> Path | None:
    """The folder with initdb and pg_ctl: pg_config's, Debian's newest, or on PATH."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        # libpq-dev's pg_config names the server folder even when no server is installed.
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))
    debian = [Path(found) for found in glob.glob(DEBIAN_BIN_GLOB)]
    candidates += sorted(debian, key=lambda p: _version(p.parent.name), reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name))


def install() -> Path:
    """The server binaries' folder, installing Debian's postgresql first where it is
    missing and this is root with apt-get; otherwise PostgresUnavailable with the reason."""
    found = find_bindir()
    if found:
        return found
    if os.geteuid() != 0:
        raise PostgresUnavailable(
            f"no PostgreSQL server binaries (initdb, pg_ctl) found, and not root to install them: {INSTALL_HINT}"
        )
    apt_get = shutil.which("apt-get")
    if not apt_get:
        raise PostgresUnavailable(
            f"no PostgreSQL server binaries (initdb, pg_ctl) found, and no apt-get: {INSTALL_HINT}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with INSTALL_LOG.open("w") as log:
        for step in (["update", "-qq"], ["install", "-y", "-qq", "postgresql"]):
            done = subprocess.run(
                [apt_get, *step], stdout=log, stderr=subprocess.STDOUT, env=env, check=False
            )
            if done.returncode != 0:
                raise PostgresUnavailable(
                    f"`apt-get {' '.join(step)}` failed (see {INSTALL_LOG}): {INSTALL_HINT}"
                )
    found = find_bindir()
    if not found:
        raise PostgresUnavailable(
            f"apt-get installed postgresql but no initdb/pg_ctl turned up (see {INSTALL_LOG}): {INSTALL_HINT}"
        )
    return found


def _server_user() -> tuple[list[str], pwd.struct_passwd | None]:
    """The command prefix that runs the server's commands, and the account it runs as
    (None: ourselves). Root hands them to the ``postgres`` system user."""
    if os.geteuid() != 0:
        return [], None
    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root, and PostgreSQL refuses root, but there is no `postgres` system "
            f"user to run it as (Debian's postgresql package creates one): {INSTALL_HINT}"
        ) from None
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--"], account
    setpriv = shutil.which("setpriv")
    if setpriv:
        ids = [f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups"]
        return [setpriv, *ids], account
    raise PostgresUnavailable(
        "running as root, and neither runuser nor setpriv (util-linux) is here to run "
        "PostgreSQL as the postgres user"
    )


@dataclass
class PostgresServer:
    """One running throwaway cluster; ``stop`` ends it and removes its directory."""

    bindir: Path
    directory: Path  # holds data/, the socket and server.log
    prefix: list[str]  # runs a command as the cluster's owner
    version: str
    started_in_s: float

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the test database, over the unix socket."""
        return f"postgresql+psycopg://{SUPERUSER}@/{DATABASE}?host={self.directory}&port={PORT}"

    @classmethod
    def start(cls) -> PostgresServer:
        """Install if needed, initdb a fresh cluster, start it and create the database."""
        began = time.monotonic()
        bindir = install()
        prefix, account = _server_user()
        directory = Path(tempfile.mkdtemp(prefix="gpuflow-pg-"))  # 0700: private socket
        if account is not None:
            os.chown(directory, account.pw_uid, account.pw_gid)
        server = cls(bindir, directory, prefix, "", 0.0)
        try:
            server._run(
                "initdb",
                ["-D", str(server.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8"]
                + ["--no-locale", "--no-sync", "--no-instructions"],
            )
            with (server.data / "postgresql.conf").open("a") as conf:
                for key, value in {**SETTINGS, "unix_socket_directories": f"'{directory}'"}.items():
                    conf.write(f"{key} = {value}\n")
            server._run(
                "pg_ctl",
                ["-D", str(server.data), "-l", str(server.log), "-o", f"-p {PORT}"]
                + ["-w", "-t", "60", "start"],
            )
            server._run(
                "createdb", ["-h", str(directory), "-p", str(PORT), "-U", SUPERUSER, DATABASE]
            )
            server.version = (server.data / "PG_VERSION").read_text().strip()
        except BaseException:
            server.stop()
            raise
        server.started_in_s = time.monotonic() - began
        return server

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "server.log"

    def stop(self) -> None:
        """Stop the server (if it runs) and remove its directory."""
        if (self.data / "postmaster.pid").exists():
            pg_ctl = [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate"]
            subprocess.run(
                [*self.prefix, *pg_ctl, "-w", "stop"],
                cwd=self.directory,
                capture_output=True,
                check=False,
            )
        shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self, tool: str, args: list[str]) -> None:
        # cwd: the server's user may not be allowed into ours.
        done = subprocess.run(
            [*self.prefix, str(self.bindir / tool), *args],
            cwd=self.directory,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise PostgresUnavailable(
                f"{tool} failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
                + (f"\nserver log:\n{log}" if log else "")
            )


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    if command == "install":
        try:
            print(f"PostgreSQL server binaries: {install()}")
        except PostgresUnavailable as exc:
            # Not fatal here: the tests that need PostgreSQL fail and say this again.
            print(f"PostgreSQL unavailable, its tests will fail: {exc}")
        return 0
    if command == "run":
        server = PostgresServer.start()
        print(
            f"PostgreSQL {server.version} in {server.started_in_s:.1f} s: {server.url}", flush=True
        )
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        finally:
            server.stop()
        return 0
    print("usage: python -m tests.helpers.postgres install|run", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
