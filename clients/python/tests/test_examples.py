"""Each example of the package runs against a real daemon and does what it says."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

from allot import Client

from .conftest import Daemon, new_daemon

PACKAGE = Path(__file__).resolve().parents[1]
EXAMPLES = PACKAGE / "examples"


def run_example(daemon: Daemon, *args: str, timeout: float = 120) -> str:
    env: Dict[str, str] = {**os.environ, "ALLOT_SERVER": daemon.url, "PYTHONPATH": str(PACKAGE)}
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_limit_api_calls_never_runs_more_than_the_quota_across_processes(daemon: Daemon) -> None:
    out = run_example(daemon, str(EXAMPLES / "limit_api_calls.py"), "--workers", "6", "--calls", "3", "--quota", "2")
    most = int(re.search(r"at most (\d+) at once", out).group(1))  # type: ignore[union-attr]
    assert 1 <= most <= 2, out


def test_gang_starts_its_members_together_and_is_followed_to_its_end(daemon: Daemon) -> None:
    out = run_example(daemon, str(EXAMPLES / "gang.py"))
    assert "application gang-example: Completed" in out, out
    assert out.count("started with the others") == 3, out


def test_long_job_keeps_its_alloc_alive_and_frees_it(daemon: Daemon) -> None:
    # As the README's daemon runs it: its default pools are the README's.
    out = run_example(daemon, str(EXAMPLES / "long_job.py"), "--min", "cpu=1", "--seconds", "2")
    assert "holding cpu=1 as worker/" in out and "freed: freed" in out, out


def test_checksum_plugin_wraps_a_local_program(data_root: Path, tmp_path: Path) -> None:
    plugin = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "checksum_plugin.py"), "--port", "0"],
        env={**os.environ, "PYTHONPATH": str(PACKAGE)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert plugin.stdout is not None
        address = plugin.stdout.readline().split("listening on ", 1)[1].strip()
        config = f'[plugins.external.checksum]\nurl = "{address}/tasks"\ntask_types = ["checksum"]\n'
        daemon = new_daemon(data_root, "--pool", "worker=cpu=2", "--run-pool", "worker", config=config)
        data = tmp_path / "data.bin"
        data.write_bytes(os.urandom(1 << 20))
        try:
            with Client(daemon.url) as client:
                client.put_queue("root.sums")
                spec = {"type": "checksum", "inputs": {"path": str(data)}, "poll_seconds": 0.05}
                app = {"id": "sums", "queue": "root.sums", "tasks": [{"id": "sum", "resources": "cpu=1", "spec": spec}]}
                assert client.submit_and_follow(app, timeout=60)["state"] == "Completed"
                outputs = client.task_run("sums", "sum")["outputs"]
                assert outputs == {"sha256": hashlib.sha256(data.read_bytes()).hexdigest()}
        finally:
            daemon.stop()
    finally:
        plugin.kill()
        plugin.wait()


@pytest.mark.parametrize("name", ["limit_api_calls.py", "gang.py", "long_job.py", "checksum_plugin.py"])
def test_every_example_says_how_to_run_it(name: str) -> None:
    text = (EXAMPLES / name).read_text()
    assert text.startswith('"""') and "python3 " in text.split('"""')[1], name


def test_the_readme_quick_start_runs_as_pasted(daemon: Daemon, tmp_path: Path) -> None:
    readme = (PACKAGE / "README.md").read_text()
    quick_start = readme.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "quick_start.py"
    script.write_text(quick_start)
    out = run_example(daemon, str(script))
    assert "holding py-" in out and "HELLO" in out and "Completed hi" in out, out
