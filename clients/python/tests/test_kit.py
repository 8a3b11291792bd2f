"""The plugin kit end to end through a daemon that runs its tasks; tokens; the generated files;
the types (mypy --strict) of the package and its examples."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, List

import httpx
import pytest

import allot
from allot import Client
from allot.plugin import JobNotFound, Plugin, PluginServer, Refused, Status, Task

from .clock import until
from .conftest import REPO, allot_bin, new_daemon, plugin_daemon

PACKAGE = Path(__file__).resolve().parents[1]


class Upper(Plugin):
    """Upper-cases ``inputs.text``; a job takes ``spec.seconds``; counts its creates."""

    task_types = ["upper"]

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: Dict[str, float] = {}
        self.texts: Dict[str, str] = {}
        self.creates = 0
        self.deleted: List[str] = []

    def create(self, task: Task) -> str:
        if not isinstance(task.inputs, dict) or "text" not in task.inputs:
            raise Refused("inputs.text is missing")
        with self.lock:
            self.creates += 1
            self.jobs[task.key] = time.monotonic() + float(task.spec.get("seconds", 0.1))
            self.texts[task.key] = str(task.inputs["text"])
        return task.key.replace("/", "-")

    def get(self, job: str) -> Status:
        key = next((k for k in self.jobs if k.replace("/", "-") == job), None)
        if key is None:
            raise JobNotFound(job)
        if time.monotonic() < self.jobs[key]:
            return Status.running("working", log_links=[("console", f"http://example.invalid/{job}")])
        return Status.succeeded({"text": self.texts[key].upper()})

    def delete(self, job: str) -> None:
        self.deleted.append(job)


def test_a_plugin_on_the_kit_runs_a_daemons_tasks(data_root: Path) -> None:
    plugin = Upper()
    with plugin_daemon(data_root, plugin, "upper", "jobs_quota = 2\n") as daemon:
        with Client(daemon.url) as client:
            client.put_queue("root.kit")
            tasks = [
                {"id": f"t{i}", "resources": "cpu=1", "spec": {"type": "upper", "inputs": {"text": f"hello {i}"}, "poll_seconds": 0.05}}
                for i in range(3)
            ]
            ended = client.submit_and_follow({"id": "kit", "queue": "root.kit", "tasks": tasks}, timeout=60)
            assert ended["state"] == "Completed"
            for i in range(3):
                run = client.task_run("kit", f"t{i}")
                assert run["outputs"] == {"text": f"HELLO {i}"}, run
            assert plugin.creates == 3
            # Bad inputs: refused by the plugin, the task fails for good.
            bad = {"id": "kit-bad", "queue": "root.kit", "tasks": [{"id": "b", "resources": "cpu=1", "spec": {"type": "upper", "inputs": {}}}]}
            with pytest.raises(allot.AppFailed):
                client.submit_and_follow(bad, timeout=60)
            assert "inputs.text is missing" in str(client.task_run("kit-bad", "b"))


class Told(Plugin):
    """A job that runs until ``finish`` is set, saying what a front end shows of it (Flyte's
    ``TaskInfo``): when it began (3 s before it was created), its console and its custom
    information; the second link comes once ``more`` is set."""

    task_types = ["told"]

    def __init__(self) -> None:
        self.began = datetime.now(timezone.utc) - timedelta(seconds=3)
        self.more = threading.Event()
        self.finish = threading.Event()

    def create(self, task: Task) -> str:
        return "job-7"

    def get(self, job: str) -> Status:
        if self.finish.is_set():
            return Status.succeeded({"rows": 3}, occurred_at=self.began.timestamp() + 1)
        links = [("console", f"https://jobs.example/{job}")]
        if self.more.is_set():
            links.append(("logs", f"https://logs.example/{job}"))
        return Status.running("working", log_links=links, custom_info={"job_id": job}, occurred_at=self.began)


def test_a_plugin_says_when_a_phase_began_its_links_and_custom_info(data_root: Path) -> None:
    plugin = Told()
    began_ms = int(plugin.began.timestamp() * 1000)
    with plugin_daemon(data_root, plugin, "told") as daemon:
        with Client(daemon.url) as client:
            client.put_queue("root.told")
            task = {"id": "t", "resources": "cpu=1", "spec": {"type": "told", "inputs": {}, "poll_seconds": 0.05}}
            client.submit_app({"id": "told", "queue": "root.told", "tasks": [task]})

            def running(links: int) -> bool:
                try:
                    events = client.task_run("told", "t")["events"]
                except allot.NotFoundError:
                    return False
                return any(e["phase"] == "Running" and len(e.get("logs", [])) == links for e in events)

            until("the job is seen running", lambda: running(1))
            plugin.more.set()
            until("its second link is seen", lambda: running(2))
            shown = subprocess.run(
                [allot_bin(), "task", "show", "told", "t", "--server", daemon.url], capture_output=True, text=True, check=True
            ).stdout
            assert "custom info: {\"job_id\":\"job-7\"}" in shown, shown
            assert "logs: https://logs.example/job-7" in shown and "console: https://jobs.example/job-7" in shown, shown
            plugin.finish.set()
            until("the task succeeds", lambda: client.task_run("told", "t")["stage"] == "ended")
            events = client.task_run("told", "t")["events"]
            running_events = [e for e in events if e["phase"] == "Running"]
            assert [e["version"] for e in running_events] == [0, 1], events
            for event in running_events:
                assert event.get("occurred_at_ms") == began_ms, event
                assert event["at_ms"] >= began_ms + 3000
                assert event.get("custom_info") == {"job_id": "job-7"}
            assert [link["name"] for link in running_events[1].get("logs", [])] == ["console", "logs"]
            success = next(e for e in events if e["phase"] == "Success")
            assert success.get("occurred_at_ms") == began_ms + 1000 and "custom_info" not in success
            timeline = subprocess.run(
                [allot_bin(), "task", "events", "told", "t", "--server", daemon.url], capture_output=True, text=True, check=True
            ).stdout
            assert "OCCURRED (UTC)" in timeline and "attempt 1 Running v1:" in timeline, timeline


class Memo(Plugin):
    """Counts the words of ``inputs.text``, keeping each count in its catalog: a text counted
    before (in the same queue) is not counted again. Its jobs end at once."""

    task_types = ["memo"]

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.results: Dict[str, Dict[str, object]] = {}

    def create(self, task: Task) -> str:
        catalog = self.catalog(task)
        text = str(task.inputs["text"])
        found = catalog.get("words", "1", {"text": text})
        if found is None:
            kept = catalog.put("words", "1", {"words": len(text.split())}, {"text": text})
            result: Dict[str, object] = {"words": kept["entry"]["outputs"]["words"], "counted": kept["created"]}
        else:
            result = {"words": found["outputs"]["words"], "counted": False, "from": f"{found['app']}/{found['task']}"}
        with self.lock:
            self.results[task.key] = result
        return task.key.replace("/", "-")

    def get(self, job: str) -> Status:
        with self.lock:
            result = next(r for k, r in self.results.items() if k.replace("/", "-") == job)
        return Status.succeeded(dict(result))


def test_a_plugin_keeps_and_looks_up_its_own_catalog_entries(data_root: Path) -> None:
    plugin = Memo()
    with plugin_daemon(data_root, plugin, "memo") as daemon:
        with Client(daemon.url) as client:
            for queue in ("root.memo-a", "root.memo-b"):
                client.put_queue(queue)

            def run(app: str, queue: str, text: str) -> Dict[str, object]:
                spec = {"type": "memo", "inputs": {"text": text}, "poll_seconds": 0.05}
                source = {"id": app, "queue": queue, "tasks": [{"id": "t", "resources": "cpu=1", "spec": spec}]}
                assert client.submit_and_follow(source, timeout=60)["state"] == "Completed"
                return dict(client.task_run(app, "t")["outputs"] or {})

            assert run("memo-1", "root.memo-a", "one two three") == {"words": 3, "counted": True}
            # The same text in the same queue: taken from the catalog.
            assert run("memo-2", "root.memo-a", "one two three") == {"words": 3, "counted": False, "from": "memo-1/t"}
            # Another queue does not reach the first one's entries.
            assert run("memo-3", "root.memo-b", "one two three") == {"words": 3, "counted": True}
            # Only while the task runs, on the daemon that runs it.
            with pytest.raises(allot.RunNotHere):
                client.catalog_lookup("memo-1", "t", "words", "1", {"text": "one two three"})
            with pytest.raises(allot.NotFoundError):
                client.catalog_put("nope", "t", "words", "1", {"words": 0})


class Buggy(Plugin):
    """A plugin with a bug: its lookups raise ``KeyError``."""

    def create(self, task: Task) -> str:
        return {"known": "job"}[task.task]

    def get(self, job: str) -> Status:
        return {"known": Status.running("on")}[job]


def test_only_the_plugins_own_job_not_found_is_a_404() -> None:
    with PluginServer(Buggy()) as server, httpx.Client() as http:
        # A KeyError of the plugin's code is a bug: a 500, which allot retries.
        got = http.get(f"{server.url}/other")
        assert got.status_code == 500 and "KeyError" in got.json()["error"], got.text
        body = {"task_type": "x", "app": "a", "task": "unknown", "attempt": 1, "inputs": None, "spec": {}}
        created = http.post(server.url, json=body)
        assert created.status_code == 500 and "KeyError" in created.json()["error"], created.text


def test_the_readme_plugin_runs_tasks_of_any_id(data_root: Path) -> None:
    readme = (REPO / "clients" / "python" / "README.md").read_text()
    code = next(block.split("```", 1)[0] for block in readme.split("```python\n") if "class Shout" in block)
    defined: Dict[str, object] = {}
    exec(code.replace("serve(Shout(), port=8000)", ""), defined)
    with PluginServer(defined["Shout"]()) as server:  # type: ignore[operator]
        config = f'[plugins.external.shout]\nurl = "{server.url}"\ntask_types = ["shout"]\n'
        daemon = new_daemon(data_root, "--pool", "worker=cpu=4", "--run-pool", "worker", config=config)
        try:
            with Client(daemon.url) as client:
                client.put_queue("root.shout")
                tasks = [{"id": "t-1", "resources": "cpu=1", "spec": {"type": "shout", "inputs": {"text": "a-b"}, "poll_seconds": 0.05}}]
                ended = client.submit_and_follow({"id": "my-app", "queue": "root.shout", "tasks": tasks}, timeout=60)
                assert ended["state"] == "Completed", ended
                assert client.task_run("my-app", "t-1")["outputs"] == {"text": "A-B"}
        finally:
            daemon.stop()


def test_the_kit_answers_the_protocol_and_creates_once_per_key() -> None:
    plugin = Upper()
    with PluginServer(plugin) as server, httpx.Client() as http:
        body = {"task_type": "upper", "app": "a", "task": "t", "attempt": 1, "inputs": {"text": "x"}, "spec": {"seconds": 5}}
        headers = {"Idempotency-Key": "a/t/1"}
        first = http.post(server.url, json=body, headers=headers).json()
        second = http.post(server.url, json=body, headers=headers).json()
        assert first == second == {"resource_meta": "a-t-1"}
        assert plugin.creates == 1, "a repeated create starts nothing new"
        status = http.get(f"{server.url}/a-t-1").json()
        assert status["phase"] == "running" and status["log_links"][0]["name"] == "console"
        assert http.get(f"{server.url}/nope").status_code == 404
        assert http.delete(f"{server.url}/a-t-1").status_code == 204 and plugin.deleted == ["a-t-1"]
        other = http.post(server.url, json={**body, "task_type": "lower"})
        assert other.status_code == 400 and "upper" in other.json()["error"]
        assert http.post(server.url, content=b"{not json").status_code == 400
        refused = http.post(server.url, json={**body, "inputs": {}}, headers={"Idempotency-Key": "a/t/2"})
        assert refused.status_code == 400 and "inputs.text" in refused.json()["error"]
    with pytest.raises(ValueError):
        Status("done")
    with pytest.raises(ValueError):
        Status.running(custom_info=["not", "an", "object"])  # type: ignore[arg-type]
    wire = Status.running(custom_info={"id": "j"}, occurred_at=datetime(2026, 1, 2, tzinfo=timezone.utc)).wire()
    assert wire["custom_info"] == {"id": "j"} and wire["occurred_at_ms"] == 1767312000000


def test_tokens_and_access(data_root: Path) -> None:
    made = subprocess.run([allot_bin(), "api-token", "make", "--user", "root"], capture_output=True, text=True, check=True)
    token = next(line.split(": ", 1)[1] for line in made.stdout.splitlines() if line.startswith("token: "))
    entry = made.stdout.split("# The daemon's configuration file keeps only the hash:\n", 1)[1]
    config = f'[auth]\n{entry}\n[[auth.bindings]]\nrole = "admin"\nusers = ["root"]\n'
    daemon = new_daemon(data_root, config=config)
    try:
        with Client(daemon.url, token="") as anonymous:
            with pytest.raises(allot.Unauthenticated):
                anonymous.namespace("x")
        with Client(daemon.url, token=token) as admin:
            made_token = admin.create_api_token("ci", "ci-bot", groups=["ops"], ttl_ms=60_000)
            assert made_token["token"].startswith("allot_")
            assert [t["name"] for t in admin.api_tokens()] == ["ci"]
            admin.put_binding("ops-read", "reader", groups=["ops"])
            assert [b["name"] for b in admin.bindings()] == ["ops-read"]
        with Client(daemon.url, token=made_token["token"]) as bot:
            deadline = time.monotonic() + 5
            while True:  # every daemon reads new tokens and bindings within a second
                try:
                    assert list(bot.namespaces()) == []
                    break
                except allot.Unauthenticated:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            with pytest.raises(allot.Forbidden) as refused:
                bot.put_namespace("x", 1)
            assert "admin" in refused.value.message
            me = bot.whoami("admin:namespace:x", "read:namespace:x")
            assert (me["user"], me["groups"], me["access"]) == ("ci-bot", ["ops"], True)
            assert me["can"] == {"admin:namespace:x": False, "read:namespace:x": True}
            with pytest.raises(allot.InvalidArgument):
                bot.whoami("nonsense")
        with Client(daemon.url, token=token) as admin:
            admin.revoke_api_token("ci")
            admin.remove_binding("ops-read")
            with pytest.raises(allot.ApiTokenNotFound):
                admin.revoke_api_token("ci")

        async def the_same_asynchronously() -> None:
            async with allot.AsyncClient(daemon.url, token=token) as admin:
                made = await admin.create_api_token("ci-2", "ci-bot")
                assert [t["name"] for t in await admin.api_tokens()] == ["ci-2"] and made["token"]
                await admin.put_binding("b", "reader", users=["ci-bot"])
                assert [b["role"] for b in await admin.bindings()] == ["reader"]
                await admin.remove_binding("b")
                await admin.revoke_api_token("ci-2")
                assert await admin.api_tokens() == []

        asyncio.run(the_same_asynchronously())
    finally:
        daemon.stop()


def test_the_generated_modules_are_those_of_the_daemons_document(daemon: object) -> None:
    url = getattr(daemon, "url") + "/openapi.json"
    check = subprocess.run(
        [sys.executable, str(PACKAGE / "scripts" / "generate.py"), "--document", url, "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_package_its_examples_and_its_bench_pass_mypy_strict() -> None:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is needed: pip install './clients/python[test]'")
    folders = ("examples", "bench", "tests")
    examples = sorted(str(p) for folder in folders for p in (PACKAGE / folder).glob("*.py"))
    examples.append(str(REPO / "examples" / "agent" / "agent.py"))
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "allot", *examples],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def sign(directory: Path, name: str, subject: str, extension: str) -> None:
    """A key and a certificate `name` signed by the CA in `directory`."""
    key, csr, pem, ext = (str(directory / f"{name}.{e}") for e in ("key", "csr", "pem", "ext"))
    Path(ext).write_text(extension + "\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key, "-out", csr, "-subj", subject)
    ca, ca_key = str(directory / "ca.pem"), str(directory / "ca.key")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", pem, "-days", "2", "-extfile", ext)


def test_https_with_a_ca_certificate_and_a_client_certificate(data_root: Path, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.fail("openssl makes the test's certificates: apt-get install openssl")
    ca, ca_key = str(tmp_path / "ca.pem"), str(tmp_path / "ca.key")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", ca_key,
            "-out", ca, "-days", "2", "-subj", "/CN=allot test CA")  # fmt: skip
    sign(tmp_path, "server", "/CN=allot", "subjectAltName=IP:127.0.0.1")
    sign(tmp_path, "ada", "/CN=ada/O=hive", "extendedKeyUsage=clientAuth")
    made = subprocess.run([allot_bin(), "api-token", "make", "--user", "root"], capture_output=True, text=True, check=True)
    token = next(line.split(": ", 1)[1] for line in made.stdout.splitlines() if line.startswith("token: "))
    entry = made.stdout.split("# The daemon's configuration file keeps only the hash:\n", 1)[1]
    config = (
        f'[auth]\n{entry}\n[auth.roles.hive]\nuse = ["namespace:hive:*"]\n'
        '[[auth.bindings]]\nrole = "admin"\nusers = ["root"]\n[[auth.bindings]]\nrole = "hive"\ngroups = ["hive"]\n'
    )
    tls = ["--tls-cert", str(tmp_path / "server.pem"), "--tls-key", str(tmp_path / "server.key"), "--tls-client-ca", ca]
    daemon = new_daemon(data_root, *tls, config=config)
    try:
        assert daemon.url.startswith("https://")
        with Client(daemon.url, token=token, retries=0) as untrusting:
            with pytest.raises(allot.ConnectionFailed) as refused:
                untrusting.namespaces().__next__()
            assert "certificate" in str(refused.value).lower()
        with Client(daemon.url, token=token, ca_cert=ca) as admin:
            admin.put_namespace("hive:a", 2)
        client_cert = (str(tmp_path / "ada.pem"), str(tmp_path / "ada.key"))
        with Client(daemon.url, token="", ca_cert=ca, client_cert=client_cert) as ada:
            with ada.token("hive:a") as grant:  # the certificate names ada of hive
                assert grant["namespace"] == "hive:a"
            with pytest.raises(allot.Forbidden):
                ada.put_namespace("hive:b", 1)
    finally:
        daemon.stop()
