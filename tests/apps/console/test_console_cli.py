"""``tenure console``: refused before anything is served (the extra missing, a bad flag, an
address off loopback without a token, a database never migrated, a port taken), each
naming the flag and never the value; and served for real, stopped by SIGTERM with exit 0.

The last test is also how a browser test starts a console: ``--port 0`` and the address
the first line of stdout prints."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from tenure.apps.cli import main

TOKEN = "cli-token-0123456789abcdef"
TOKEN_TAKES = ("at least 16 printable ASCII characters without spaces that look random (`tenure console "
               "--generate-token` prints one); required with a --host that is not loopback; or set "
               "TENURE_CONSOLE_TOKEN")


def refusal(capsys: pytest.CaptureFixture[str], *arguments: str) -> list[str]:
    assert main(["console", *arguments]) == 2
    out = capsys.readouterr().out
    assert TOKEN not in out and "S3cr3t" not in out and "aaaaaaaa" not in out
    return out.splitlines()


def test_without_the_extra_the_console_is_refused_with_the_install_line(
    console_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tenure.apps.console import command

    monkeypatch.setattr(command, "console_installed", lambda: False)
    assert refusal(capsys, "--db", console_url) == [
        "refused: invalid_arguments",
        "  tenure console: console_not_installed (install the console extra: pip install 'tenure[console]')",
        "  `tenure COMMAND --help` lists what each option takes",
    ]


def test_the_extra_check_finds_each_library_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from tenure.apps.console import settings

    assert settings.console_installed()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "jinja2" else real(name))
    assert not settings.console_installed()


@pytest.mark.parametrize(("arguments", "line"), [
    (["--port", "70000"], "  --port: integer_out_of_range (--port takes 0 to 65,535 (0: a free port, printed))"),
    (["--port", "S3cr3t"], "  --port: integer_required (--port takes an integer: 0 to 65,535 (0: a free port, "
                           "printed))"),
    (["--host", "S3cr3t host"], "  --host: host_required (--host takes an address of this machine or a host name "
                                "(default 127.0.0.1); any but loopback needs --token)"),
    (["--host", "0.0.0.0"], "  --token: token_required_off_loopback (--token takes " + TOKEN_TAKES + ")"),
    (["--host", "0.0.0.0", "--token", "S3cr3t"], "  --token: token_too_short (--token takes " + TOKEN_TAKES + ")"),
    (["--host", "0.0.0.0", "--token", "S3cr3tS3cr3tS3cr3t"], "  --token: token_too_weak (--token takes "
                                                             + TOKEN_TAKES + ")"),
])
def test_a_bad_flag_is_refused_naming_the_flag_and_what_it_takes(
    arguments: list[str], line: str, capsys: pytest.CaptureFixture[str],
) -> None:
    lines = refusal(capsys, "--db", "sqlite:///console-flags.db", *arguments)
    assert lines[:2] == ["refused: invalid_arguments", line]


def test_a_weak_token_from_the_environment_is_refused_without_echoing_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TENURE_CONSOLE_TOKEN", "aaaaaaaaaaaaaaaa")
    lines = refusal(capsys, "--db", "sqlite:///console-flags.db", "--host", "0.0.0.0")
    assert lines[:2] == ["refused: invalid_arguments", "  --token: token_too_weak (--token takes " + TOKEN_TAKES + ")"]


def test_generate_token_prints_a_fresh_token_a_console_accepts_and_needs_no_database(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tenure.apps.console.settings import ConsoleSettings

    monkeypatch.delenv("TENURE_DB", raising=False)
    printed = []
    for _ in range(2):
        assert main(["console", "--generate-token"]) == 0
        printed.append(capsys.readouterr().out)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{43}\n", out) for out in printed) and printed[0] != printed[1]
    token = printed[0].strip()
    assert ConsoleSettings(db_url="sqlite:///x.db", host="0.0.0.0", token=token).token == token


def test_the_token_may_come_from_the_environment_and_a_database_never_migrated_is_refused(
    fresh_db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TENURE_CONSOLE_TOKEN", TOKEN)
    lines = refusal(capsys, "--db", fresh_db_url, "--host", "0.0.0.0", "--port", "0")
    assert lines[0].startswith("refused: ") and "run `tenure migrate --db URL` first (tenure console never " \
        "migrates)" in lines[0]
    assert fresh_db_url not in "\n".join(lines)


def test_a_port_another_process_serves_is_refused_naming_the_port(
    console_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        lines = refusal(capsys, "--db", console_url, "--port", str(port))
    assert lines[:2] == ["refused: invalid_arguments",
                         "  --port: port_in_use (another process serves that port: pick another, or 0)"]


def test_tenure_console_serves_until_sigterm_and_exits_zero(console_url: str) -> None:
    server = subprocess.Popen(
        [sys.executable, "-P", "-m", "tenure.apps.cli", "console", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TENURE_DB": console_url})
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        found = re.fullmatch(r"console: serving (http://127\.0\.0\.1:[0-9]+/) \((sqlite|postgresql); loopback only, "
                             r"no token\); Ctrl-C stops\n", first)
        assert found is not None, first + (server.stderr.read() if server.poll() is not None and server.stderr else "")
        with urllib.request.urlopen(found.group(1) + "consents", timeout=30) as response:
            assert response.status == 200
            assert "server-timing" in {name.lower() for name in response.headers}
            assert b'data-page="consents"' in response.read()
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.communicate()
    assert server.returncode == 0, err
    assert console_url not in first + out + err
