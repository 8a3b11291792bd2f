"""A real daemon for the tests: ``allot serve`` (``ALLOT_BIN``, else the repository's
``target/debug/allot``) on a free port with a temporary data directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, List, Optional

import pytest

if TYPE_CHECKING:
    from allot.plugin import Plugin

REPO = Path(__file__).resolve().parents[3]


def allot_bin() -> str:
    path = os.environ.get("ALLOT_BIN") or str(REPO / "target" / "debug" / "allot")
    if not Path(path).exists():
        pytest.fail(f"no allot binary at {path}: build it (cargo build -p allot) or set ALLOT_BIN")
    return path


class Daemon:
    """``allot serve`` with ``args``; ``url`` once it listens."""

    def __init__(self, data_dir: Path, args: List[str], listen: str = "127.0.0.1:0") -> None:
        self.data_dir, self.args = data_dir, args
        self.log = data_dir.with_suffix(".log")
        self.url = ""
        self.process: Optional["subprocess.Popen[str]"] = None
        self.start(listen)

    def start(self, listen: str) -> None:
        log = open(self.log, "a")
        self.process = subprocess.Popen(
            [allot_bin(), "serve", "--listen", listen, "--data-dir", str(self.data_dir), *self.args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("allot listening on "):
            raise RuntimeError(f"the daemon did not start: {self.log.read_text()}")
        self.url = line.split("allot listening on ", 1)[1].strip()
        # Keep reading so the daemon never blocks on a full pipe.
        threading.Thread(target=self.process.stdout.read, daemon=True).start()

    def address(self) -> str:
        return self.url.split("://", 1)[1]

    def stop(self, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(timeout=30)
        self.process = None

    def restart(self) -> None:
        """Stops it and starts it again on the same address, with the same data."""
        address = self.address()
        self.stop()
        self.start(address)


@pytest.fixture(scope="session")
def data_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="allot-py-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


_count = 0


#: What every test daemon's configuration file says: applications complete a second after their
#: last task (not 30 s), and a plugin kit's plugin may be named (`plugin_url`).
CONFIG = """
[scheduler]
completing_grace = "1s"
"""


def new_daemon(root: Path, *args: str, config: str = "") -> Daemon:
    global _count
    _count += 1
    path = root / f"daemon-{_count}.toml"
    path.write_text(CONFIG + config)
    return Daemon(root / f"daemon-{_count}", ["--config", str(path), *args])


@contextmanager
def plugin_daemon(root: Path, plugin: "Plugin", plugin_id: str, extra: str = "") -> Iterator[Daemon]:
    """``plugin`` served by the kit, and a daemon (pool ``worker``, which it runs) that runs
    its task types through it as external plugin ``plugin_id`` (``extra``: more of its table)."""
    from allot.plugin import PluginServer

    with PluginServer(plugin) as server:
        types = ", ".join(f'"{t}"' for t in plugin.task_types)
        config = f'[plugins.external.{plugin_id}]\nurl = "{server.url}"\ntask_types = [{types}]\n{extra}'
        daemon = new_daemon(root, "--pool", "worker=cpu=4", "--run-pool", "worker", config=config)
        try:
            yield daemon
        finally:
            daemon.stop()


@pytest.fixture(scope="session")
def daemon(data_root: Path) -> Iterator[Daemon]:
    """One daemon for the tests that share it: a pool `worker` whose tasks it runs."""
    d = new_daemon(data_root, "--pool", "worker=cpu=8,mem=16GiB", "--run-pool", "worker")
    yield d
    d.stop()


@pytest.fixture
def fresh_daemon(data_root: Path) -> Iterator[Daemon]:
    """A daemon of the test's own (for restarts)."""
    d = new_daemon(data_root, "--pool", "worker=cpu=4", "--run-pool", "worker")
    yield d
    d.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
