"""No secret in any output: every credential form redis-py reads from a Redis URL (user and
password, a password holding '@' and ':', a password alone, a bare name, `password=` and `username=`
in the query, on TCP, TLS and unix sockets) is hidden by `remote_url.redacted` and never reaches what
`cachectl config`, `doctor` and `stats` print, as text or JSON, in warnings or errors. The remote is
unreachable (127.0.0.1 port 9, a missing socket), so no server is needed; the commands of all forms
run in one child process (Triton and JAX are imported once). A password file that is not UTF-8 is a
one-line configuration error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, child_env

from kernel_cache import Config, ConfigError, Store
from kernel_cache.settings.remote_url import redacted

# (URL with {host} and {sock} to fill in, the secrets it holds)
FORMS = [
    ("redis://kc:s3cret@{host}/0", ["s3cret"]),
    ("redis://kc:p@ss:w0rd@{host}/0", ["p@ss", "w0rd"]),
    ("redis://:s3cret@{host}/0", ["s3cret"]),
    ("redis://s3cret@{host}/0", ["s3cret"]),
    ("rediss://u:s3cret@{host}/0?password=s3cret2&username=admin", ["s3cret", "admin"]),
    ("unix://kc:s3cret@{sock}?db=0&password=s3cret2", ["s3cret"]),
    ("redis://{host}/0?password=s3cret", ["s3cret"]),
    ("rediss://{host}/0?ssl_password=tlsS3cret", ["tlsS3cret"]),
    ("redis://kc:firstS3cret@{host}/0,redis://kc:secondS3cret@{host}/0", ["firstS3cret", "secondS3cret"]),
]
IDS = ["user-password", "password-with-at-and-colon", "password-only", "bare-name", "tls-query",
       "unix-query", "query-only", "tls-key-password", "several-urls"]

SHOWN = {  # what operators see: the user name stays, every secret is ***
    "redis://kc:s3cret@h:6379/0": "redis://kc:***@h:6379/0",
    "redis://kc:p@ss:w0rd@h/0": "redis://kc:***@h/0",
    "redis://:s3cret@h/0": "redis://:***@h/0",
    "redis://s3cret@h/0": "redis://***@h/0",
    "rediss://u:s3cret@h/0?password=s3cret2&username=admin": "rediss://u:***@h/0?password=***&username=***",
    "unix://kc:s3cret@/tmp/x.sock?db=0&password=s3cret2": "unix://kc:***@/tmp/x.sock?db=0&password=***",
    "redis://h/0?password=s3cret": "redis://h/0?password=***",
    "redis://h/0?password=s3@cret&db=1": "redis://h/0?password=***&db=1",  # '@' in a query value
    "redis://h/0?db=0;pass%77ord=s3cret": "redis://h/0?db=0;pass%77ord=***",  # a name percent-encoded
    "redis://kc:s3/cret@h/0": "redis://***@h/0",  # '/' unencoded: no URL, all before the last '@' hidden
    "redis://kc:s3cret@[::1/0": "redis://kc:***@[::1/0",  # urlparse raises on it; redacted does not
    "kc:s3cret@h": "kc:***@h",  # no '//' at all
    "redis://h:6379/0": "redis://h:6379/0",
    "unix:///run/redis.sock?db=2": "unix:///run/redis.sock?db=2",
    "rediss://h/0?ssl_password=a@b&ssl_keyfile_password=c": "rediss://h/0?ssl_password=***&ssl_keyfile_password=***",
    "redis://a:p1@h1/0,redis://b:p,2@h2/0": "redis://a:***@h1/0,redis://b:***@h2/0",  # a comma before a scheme
    "": "",
}

COMMANDS = [["config"], ["config", "--json"], ["doctor"], ["doctor", "--json"], ["stats"], ["stats", "--json"]]

# Runs every command on every URL through cachectl's main(), each with its own captured stdout and
# stderr (warnings always shown, none remembered from an earlier command); writes them as JSON.
CHILD = """
import contextlib, io, json, os, sys, warnings
from kernel_cache.telemetry import warnings_once
from cachectl.main import main
out, urls, commands = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
runs = []
for url in urls:
    os.environ["KERNEL_CACHE_REMOTE"] = url
    for command in commands:
        warnings_once.reset()
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), warnings.catch_warnings():
            warnings.simplefilter("always")
            code = main(command)
        runs.append({"url": url, "command": command, "code": code, "stdout": stdout.getvalue(),
                     "stderr": stderr.getvalue()})
with open(out, "w") as f:
    json.dump(runs, f)
"""


def _filled(template: str, host: str, sock: str) -> str:
    return template.format(host=host, sock=sock)


@pytest.mark.parametrize("url, shown", SHOWN.items(), ids=range(len(SHOWN)))
def test_redacted_shows_the_user_name_and_hides_the_secrets(url, shown):
    assert redacted(url) == shown


@pytest.mark.parametrize("template, secrets", FORMS, ids=IDS)
def test_redacted_hides_every_credential_form(template, secrets):
    for host in ("h", "h:6379", "127.0.0.1:9", "[::1]:6379"):
        text = redacted(_filled(template, host, "/tmp/x.sock"))
        assert not [s for s in secrets if s in text], text


def test_redacted_accepts_any_text():
    for text in ("@", "//@", "@@//", "s3cret@h//x", "redis://", "?password=", "&password=x@", "redis://[@", "\x00@\udcff",
                 "redis://h/0?password", "redis://u:p@h:notaport/0"):
        shown = redacted(text)
        assert isinstance(shown, str) and ("@" not in text or "***" in shown)


@pytest.fixture(scope="module")
def cachectl_runs(tmp_path_factory) -> list[dict]:
    """Every command of COMMANDS on every form of FORMS, against an unreachable remote."""
    work = tmp_path_factory.mktemp("secrets")
    cache = work / "cache"
    Store(Config(dir=cache)).close()  # a cache of its own: `doctor` makes none (a diagnosis changes nothing)
    urls = [_filled(template, "127.0.0.1:9", str(work / "no.sock")) for template, _ in FORMS]
    out = work / "runs.json"
    env = child_env(KERNEL_CACHE_DIR=str(cache), KERNEL_CACHE_REMOTE_UNSIGNED="1", KERNEL_CACHE_REMOTE_TIMEOUT="50ms")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), json.dumps(urls), json.dumps(COMMANDS)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    for _, secrets in FORMS:  # anything the child printed outside the captured commands
        assert not [s for s in secrets if s in proc.stdout + proc.stderr], proc.stdout + proc.stderr
    runs: list[dict] = json.loads(out.read_text())
    assert len(runs) == len(FORMS) * len(COMMANDS)
    return runs


@pytest.mark.parametrize("form", range(len(FORMS)), ids=IDS)
def test_no_cachectl_command_prints_a_secret(cachectl_runs, form):
    template, secrets = FORMS[form]
    runs = cachectl_runs[form * len(COMMANDS):(form + 1) * len(COMMANDS)]
    for run in runs:
        what = f"cachectl {' '.join(run['command'])} with {run['url']}"
        text = run["stdout"] + run["stderr"]
        assert not [s for s in secrets if s in text], f"{what} printed a secret:\n{text}"
        # the remote was configured and shown (and, but by `config`, tried): the check is not vacuous
        assert redacted(run["url"]) in text, f"{what} did not show the remote:\n{text}"
        allowed = {"config": {0}, "doctor": {1}, "stats": {0, 1}}[run["command"][0]]  # the remote is down
        assert run["code"] in allowed, f"{what} exited {run['code']}:\n{text}"
        if run["command"][0] != "config":
            assert "Connection refused" in text or "No such file" in text, f"{what} did not try the remote:\n{text}"


def test_a_password_file_that_is_not_utf8_is_a_one_line_configuration_error(tmp_path):
    secret = tmp_path / "redis\npassword"  # a newline in the name: echo() keeps the message one line
    secret.write_bytes(b"s3cret\xff\xfe")
    secret.chmod(0o600)
    with pytest.raises(ConfigError, match="KERNEL_CACHE_REMOTE_PASSWORD_FILE=.* is not UTF-8"):
        Config.from_env({"KERNEL_CACHE_REMOTE_PASSWORD_FILE": str(secret)})
    proc = subprocess.run([sys.executable, "-m", "kernel_cache", "config"], cwd=tmp_path, capture_output=True,
                          text=True, env=child_env(KERNEL_CACHE_REMOTE_PASSWORD_FILE=secret.name), timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("cachectl: KERNEL_CACHE_REMOTE_PASSWORD_FILE=") and "redis\\npassword" in proc.stderr
    assert "s3cret" not in proc.stderr


ECHO_CHILD = """
import contextlib, io, json, os, sys, warnings
from kernel_cache import Config, Store
from kernel_cache.telemetry import warnings_once
from cachectl.main import main
texts = []
for command in (["stats"], ["stats", "--json"], ["doctor"]):
    warnings_once.reset()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
        warnings.simplefilter("always")
        main(command)
    texts.append(out.getvalue())
warnings_once.reset()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    store = Store(Config.from_env())
    store.get("0" * 32)
texts += [str(w.message) for w in caught]
print(json.dumps(texts))
"""


@pytest.mark.parametrize("url", ["redis://kcuser:EchoedS3cret@127.0.0.1:{port}/0",
                                 "redis://kcuser:EchoedS3cret@127.0.0.1:{port}/0?protocol=2"],
                         ids=["hello", "auth"])
def test_a_server_that_echoes_the_handshake_never_prints_the_password(url, tmp_path):
    from fake_resp import FakeRedis

    with FakeRedis("echo") as fake:
        proc = subprocess.run([sys.executable, "-c", ECHO_CHILD], cwd=ROOT, capture_output=True, text=True,
                              env=child_env(KERNEL_CACHE_DIR=str(tmp_path / "c"), KERNEL_CACHE_REMOTE_UNSIGNED="1",
                                            KERNEL_CACHE_REMOTE=url.format(port=fake.port)), timeout=300)
        sent = [b" ".join(command) for command in fake.commands]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any(b"EchoedS3cret" in words for words in sent)  # the client did send it, and the server echoed it
    text = "\n".join(json.loads(proc.stdout)) + proc.stderr
    assert "unknown command" in text, text  # the server's words are shown...
    assert "EchoedS3cret" not in text and "kcuser" not in text.replace("kcuser:***", ""), text  # ...never its secrets


@pytest.mark.parametrize("url, wrong", [("redis://:pw@127.0.0.1:99999/0", "port"), ("http://h/0", "no Redis URL"),
                                        ("redis://kc:pw/x@h/0", "percent-encoded"), ("redis://h/abc", "database"),
                                        ("redis://h/0?socket_timeout=x", "socket_timeout"),
                                        ("redis://h/0,redis://:pw@h:0/0", "port")])
def test_a_url_redis_py_cannot_use_is_a_configuration_error_naming_what(url, wrong):
    with pytest.raises(ConfigError, match=wrong) as caught:
        Config.from_env({"KERNEL_CACHE_REMOTE": url})
    assert "pw" not in str(caught.value).replace("***", "")
