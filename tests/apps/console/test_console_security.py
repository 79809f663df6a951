"""The console's guards: the token (Bearer header or the login form's session cookie),
CSRF on every POST, loopback-only answering without a token, and what a console may be
configured with. The token never appears in a page, a header or a cookie."""

from __future__ import annotations

import hmac
import logging
import secrets
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
from adapter_support import _run_async
from console_html import by_testid, csrf_of, texts
from console_seed import Seeded, seed

from tenure.apps.console.security import (
    FORGET_AFTER_S,
    FREE_FAILURES,
    GLOBAL_FAILURE_BURST,
    GLOBAL_FAILURES_PER_SECOND,
    LOG_BURST,
    MAX_LOCKOUT_S,
    MAX_TRACKED_CLIENTS,
    SESSION_MAX_AGE_S,
    Guard,
    SignInThrottle,
    host_allowed,
    safe_next,
)
from tenure.apps.console.settings import MIN_TOKEN_BITS, ConsoleSettings, estimated_token_bits, generate_token
from tenure.model import ConfigValidationError

TOKEN = "console-token-0123456789abcdef"
"""A token in the tests: it must never be sent back."""


@pytest.fixture
def seeded_url(console_url: str) -> tuple[str, Seeded]:
    return console_url, _run_async(seed(console_url))


def never_shows_the_token(response: Any) -> Any:
    assert TOKEN not in response.text
    assert not any(TOKEN in value for value in response.headers.values())
    return response


def test_off_loopback_every_request_needs_the_token_by_header_or_by_the_login_cookie(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    client = console(url, host="0.0.0.0", token=TOKEN, base_url="http://console.internal:8787")
    # Without it: a page redirects to the login form (keeping where it was going), the
    # rest is a 401, and no view ran.
    response = never_shows_the_token(client.get("/runs?status=queued"))
    assert response.status_code == 303
    location = urllib.parse.urlsplit(response.headers["location"])
    assert location.path == "/login" and urllib.parse.parse_qs(location.query)["next"] == ["/runs?status=queued"]
    assert client.get("/api/live").status_code == 401
    assert client.get("/api/live").headers["www-authenticate"].startswith("Bearer")
    assert client.post(f"/runs/{data.queued_run}/cancel", data={"csrf_token": "0" * 64}).status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code == 303
    assert client.get("/", headers={"Authorization": "Basic " + TOKEN}).status_code == 303
    # The style sheet and the login form need no token.
    assert client.get("/static/console.css").status_code == 200
    login = never_shows_the_token(client.get("/login?next=/runs"))
    assert login.status_code == 200 and by_testid(login.text, "login-form")
    # With the header.
    assert never_shows_the_token(client.get("/", headers={"Authorization": f"Bearer {TOKEN}"})).status_code == 200
    # With the cookie the login form sets: a wrong token first, then the right one.
    token = csrf_of(login.text)
    refused = never_shows_the_token(client.post("/login", data={"csrf_token": token, "token": "nope", "next": "/runs"}))
    assert refused.status_code == 401 and by_testid(refused.text, "login-refused")
    assert "tenure_console_session" not in refused.headers.get("set-cookie", "")
    signed_in = never_shows_the_token(client.post("/login", data={"csrf_token": token, "token": TOKEN,
                                                                  "next": "/runs"}))
    assert signed_in.status_code == 303 and signed_in.headers["location"] == "/runs"
    assert "httponly" in signed_in.headers["set-cookie"].lower()
    assert "samesite=strict" in signed_in.headers["set-cookie"].lower()
    assert client.get("/").status_code == 200 and client.get("/api/live").status_code == 200
    # A session cookie that is not this process's is refused.
    other = console(url, host="0.0.0.0", token=TOKEN, base_url="http://console.internal:8787")
    other.cookies.set("tenure_console_session", client.cookies["tenure_console_session"])
    assert other.get("/").status_code == 303
    other.cookies.set("tenure_console_session", "forged.value")
    assert other.get("/").status_code == 303
    # Signing out ends the session, on the server too: a copy of the cookie is refused.
    copied = client.cookies["tenure_console_session"]
    page = client.get(f"/runs/{data.queued_run}").text
    assert client.post("/logout", data={"csrf_token": csrf_of(page)}).status_code == 303
    assert client.get("/").status_code == 303
    client.cookies.set("tenure_console_session", copied)
    assert client.get("/").status_code == 303


def test_a_csrf_token_is_bound_to_the_session_so_a_planted_nonce_and_the_public_login_page_forge_nothing(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    operator = console(url, host="0.0.0.0", token=TOKEN, base_url="http://console.internal:8787")
    operator.post("/login", data={"csrf_token": csrf_of(operator.get("/login").text), "token": TOKEN, "next": "/"})
    assert operator.get("/").status_code == 200
    # An attacker who can plant cookies for the host reads the public login page, learns
    # the CSRF token of its own nonce, and plants that nonce in the operator's browser.
    attacker = console(url, host="0.0.0.0", token=TOKEN, base_url="http://console.internal:8787")
    forged = csrf_of(attacker.get("/login").text)
    operator.cookies.set("tenure_console_csrf", attacker.cookies["tenure_console_csrf"])
    path = f"/consents/{data.pending_consent}"
    refused = operator.post(path + "/decide", data={"csrf_token": forged, "verdict": "grant", "by": "mallory"})
    assert refused.status_code == 403
    assert texts(operator.get(path).text, "consent-status") == ["pending"]


def test_a_post_from_another_origin_is_refused_even_with_a_valid_csrf_token(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    client = console(url)
    path = f"/consents/{data.pending_consent}"
    good = csrf_of(client.get(path).text)
    fields = {"csrf_token": good, "verdict": "grant", "by": "mallory"}
    for headers in ({"origin": "http://127.0.0.1:9999"}, {"origin": "http://evil.example"},
                    {"sec-fetch-site": "cross-site"}, {"sec-fetch-site": "same-site"},
                    {"sec-fetch-site": "cross-site", "origin": "http://127.0.0.1:8787"}):
        assert client.post(path + "/decide", data=fields, headers=headers).status_code == 403, headers
    assert texts(client.get(path).text, "consent-status") == ["pending"]
    same = {"origin": "null", "sec-fetch-site": "same-origin"}  # Chromium under the console's no-referrer policy
    assert client.post(path + "/decide", data={**fields, "by": "bob"}, headers=same).status_code == 303


def test_a_session_expires_after_twelve_hours() -> None:
    now = [1_000_000.0]
    guard = Guard("t" * 16, b"k" * 32, clock=lambda: now[0])
    session = guard.new_session()
    assert guard.session_valid(session)
    now[0] += SESSION_MAX_AGE_S - 1
    assert guard.session_valid(session)
    now[0] += 1
    assert not guard.session_valid(session)
    # A signed cookie whose issue time was edited no longer matches its HMAC.
    nonce, issued, mac = guard.new_session().split(".")
    assert not guard.session_valid(f"{nonce}.{int(issued) + 3600}.{mac}")


def test_the_login_form_sends_the_browser_only_to_a_path_of_this_console(
    console_url: str, console: Callable[..., Any],
) -> None:
    client = console(console_url, host="0.0.0.0", token=TOKEN, base_url="http://console.internal:8787")
    for target in ("//evil.example/x", "https://evil.example/", "javascript:alert(1)", "/\\evil.example"):
        token = csrf_of(client.get("/login").text)  # a sign-in binds the next forms to its session
        response = client.post("/login", data={"csrf_token": token, "token": TOKEN, "next": target})
        assert response.headers["location"] == "/", target
    assert [safe_next(target) for target in ("/jobs?status=failed", "", None, "x")] == ["/jobs?status=failed", "/",
                                                                                      "/", "/"]


def test_a_post_without_the_csrf_token_or_with_a_wrong_one_is_refused_and_changes_nothing(
    seeded_url: tuple[str, Seeded], console: Callable[..., Any],
) -> None:
    url, data = seeded_url
    client = console(url)
    path = f"/consents/{data.pending_consent}"
    good = csrf_of(client.get(path).text)
    stranger = console(url)  # another browser: its own nonce cookie
    theirs = csrf_of(stranger.get(path).text)
    other_process = Guard(None).csrf_token(client.cookies["tenure_console_csrf"], None)
    for fields in ({}, {"csrf_token": ""}, {"csrf_token": "0" * 64}, {"csrf_token": theirs},
                   {"csrf_token": other_process}, {"csrf_token": good[:-1]}):
        response = client.post(path + "/decide", data={**fields, "verdict": "grant", "by": "mallory"})
        assert response.status_code == 403, fields
        assert by_testid(response.text, "error-page")[0].attributes["data-status"] == "403"
    # Without the nonce cookie, the right-looking field proves nothing either.
    cookieless = console(url)
    refused = cookieless.post(path + "/decide", data={"csrf_token": good, "verdict": "grant", "by": "x"})
    assert refused.status_code == 403
    # Not a form at all.
    assert client.post(path + "/decide", json={"csrf_token": good, "verdict": "grant"}).status_code == 415
    assert client.post(path + "/decide", content=b"csrf_token=" + b"a" * 70_000,
                       headers={"content-type": "application/x-www-form-urlencoded"}).status_code == 413
    assert texts(client.get(path).text, "consent-status") == ["pending"]
    response = client.post(path + "/decide", data={"csrf_token": good, "verdict": "grant", "by": "bob"})
    assert response.status_code == 303


def test_without_a_token_the_console_answers_only_requests_addressed_to_loopback(
    console_url: str, console: Callable[..., Any],
) -> None:
    for base_url, status in (("http://127.0.0.1:8787", 200), ("http://localhost:8787", 200),
                             ("http://[::1]:8787", 200), ("http://evil.example:8787", 400),
                             ("http://127.0.0.1.evil.example", 400), ("http://192.168.1.20:8787", 400)):
        response = console(console_url, base_url=base_url).get("/runs")
        assert response.status_code == status, base_url
    assert not host_allowed(None) and not host_allowed("") and host_allowed("127.0.0.2")


def test_a_console_off_loopback_needs_a_token_of_sixteen_printable_characters() -> None:
    def refused(**settings: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        with pytest.raises(ConfigValidationError) as caught:
            ConsoleSettings(db_url="sqlite:///x.db", **settings)
        return caught.value.fields, caught.value.problems

    assert refused(host="0.0.0.0") == (("token",), ("token_required_off_loopback",))
    assert refused(host="console.internal") == (("token",), ("token_required_off_loopback",))
    assert refused(token="short") == (("token",), ("token_too_short",))
    assert refused(token="has spaces in the token") == (("token",), ("token_not_printable_ascii",))
    assert refused(port=70_000) == (("port",), ("integer_out_of_range",))
    assert refused(host="bad host") == (("host",), ("host_required",))
    assert ConsoleSettings(db_url="sqlite:///x.db", host="::1").loopback_only
    assert not ConsoleSettings(db_url="sqlite:///x.db", host="0.0.0.0", token=TOKEN).loopback_only
    assert TOKEN not in repr(ConsoleSettings(db_url="sqlite:///x.db", host="0.0.0.0", token=TOKEN))


def test_csrf_tokens_and_sessions_are_bound_to_the_process_secret() -> None:
    guard, other = Guard("t" * 16, b"k" * 32), Guard("t" * 16, b"j" * 32)
    nonce = guard.new_csrf_nonce()
    session = guard.new_session()
    assert guard.csrf_valid(nonce, guard.csrf_token(nonce, session), session)
    assert not other.csrf_valid(nonce, guard.csrf_token(nonce, session), session)
    assert not guard.csrf_valid(guard.new_csrf_nonce(), guard.csrf_token(nonce, session), session)
    assert not guard.csrf_valid(nonce, guard.csrf_token(nonce, None), session)  # bound to the session
    assert not guard.csrf_valid(nonce, guard.csrf_token(nonce, session), guard.new_session())
    assert guard.session_valid(session) and not other.session_valid(session)
    assert "t" * 16 not in session
    assert guard.bearer_matches("Bearer " + "t" * 16) and guard.bearer_matches("bearer  " + "t" * 16)
    assert not guard.bearer_matches("Bearer " + "t" * 15) and not Guard(None).token_matches("x")


# --- tokens that do not look random, and guessing -------------------------------------


WEAK_TOKENS = ("aaaaaaaaaaaaaaaa", "0123456789abcdef", "abcdefghijklmnop", "passwordpassword", "acacacacacacacac",
               "qwertyuiopasdfgh", "1111111111111111", "zyxwvutsrqponmlkjihg")


@pytest.mark.parametrize("weak", WEAK_TOKENS)
def test_a_token_that_does_not_look_random_is_refused_saying_why_and_never_what(weak: str) -> None:
    with pytest.raises(ConfigValidationError) as caught:
        ConsoleSettings(db_url="sqlite:///x.db", host="0.0.0.0", token=weak)
    assert (caught.value.fields, caught.value.problems) == (("token",), ("token_too_weak",))
    assert weak not in str(caught.value) and weak not in repr(caught.value)
    assert estimated_token_bits(weak) < MIN_TOKEN_BITS


def test_generated_tokens_and_random_ones_of_every_common_shape_are_accepted() -> None:
    import string
    import uuid

    shapes = (generate_token, lambda: secrets.token_urlsafe(16), lambda: secrets.token_hex(16),
              lambda: str(uuid.uuid4()), lambda: "".join(secrets.choice(string.printable[:94]) for _ in range(20)))
    for make in shapes:
        for _ in range(200):
            token = make()
            assert ConsoleSettings(db_url="sqlite:///x.db", host="0.0.0.0", token=token).token == token
    assert estimated_token_bits(generate_token()) > 3 * MIN_TOKEN_BITS
    assert len(generate_token()) == 43 and generate_token() != generate_token()


class Clock:
    """A monotonic clock a test steps by hand: nothing here waits on wall time."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def sign_in(client: Any, token: str) -> Any:
    fields = {"csrf_token": csrf_of(client.get("/login").text), "token": token, "next": "/"}
    return never_shows_the_token(client.post("/login", data=fields))


def test_failed_sign_ins_lock_the_address_out_with_429_and_retry_after_and_a_locked_guess_is_never_compared(
    console_url: str, console: Callable[..., Any], caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    throttle = SignInThrottle(clock)
    options = {"host": "0.0.0.0", "token": TOKEN, "base_url": "http://console.internal:8787", "throttle": throttle}
    guesser = console(console_url, client_address="203.0.113.7", **options)
    caplog.set_level(logging.WARNING, logger="tenure.apps.console")
    for attempt in range(FREE_FAILURES):
        assert sign_in(guesser, f"guess-{attempt}-aZ3kQ9vLp2Xw").status_code == 401, attempt
    # Locked: the right token is not even compared, by the form or by the header.
    locked = sign_in(guesser, TOKEN)
    assert locked.status_code == 429 and locked.headers["retry-after"] == "1"
    assert "tenure_console_session" not in locked.headers.get("set-cookie", "")
    bearer = guesser.get("/api/live", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 429 and bearer.headers["retry-after"] == "1"
    # Another address is not locked; a signed-in browser never is.
    other = console(console_url, client_address="198.51.100.2", **options)
    assert other.get("/api/live", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert sign_in(other, TOKEN).status_code == 303 and other.get("/").status_code == 200
    # The lockout ends; the next failure doubles it (up to MAX_LOCKOUT_S).
    clock.now += 1
    assert sign_in(guesser, "guess-again-aZ3kQ9vLp2Xw").status_code == 401
    assert sign_in(guesser, TOKEN).headers["retry-after"] == "2"
    clock.now += 2
    for _ in range(20):
        assert sign_in(guesser, "still-guessing-aZ3kQ9vLp2Xw").status_code == 401
        clock.now += MAX_LOCKOUT_S
    assert sign_in(guesser, "last-guess-aZ3kQ9vLp2Xw").status_code == 401
    assert sign_in(guesser, TOKEN).headers["retry-after"] == str(int(MAX_LOCKOUT_S))
    # Each failure was logged at WARNING, with where it came from and never what was sent.
    failures = [record.getMessage() for record in caplog.records if "sign-in failed" in record.getMessage()]
    assert len(failures) == FREE_FAILURES + 22  # the 429s compared nothing and are no failures
    assert all("203.0.113.7" in line and "the login form" in line for line in failures)
    assert "1 failed in a row" in failures[0] and "locked out" not in failures[FREE_FAILURES - 2]
    assert "locked out for 1 s" in failures[FREE_FAILURES - 1]
    assert not any("guess" in record.getMessage() or TOKEN in record.getMessage() for record in caplog.records)


def test_bearer_guesses_are_throttled_like_the_login_form(console_url: str, console: Callable[..., Any]) -> None:
    clock = Clock()
    client = console(console_url, host="0.0.0.0", token=TOKEN, base_url="http://console.internal:8787",
                     throttle=SignInThrottle(clock))
    answers = [client.get("/api/live", headers={"Authorization": f"Bearer wrong-{n}-aZ3kQ9vLp2Xw"}).status_code
               for n in range(FREE_FAILURES + 1)]
    assert answers == [401] * FREE_FAILURES + [429]
    # Neither a request without a credential nor a Basic one is a guess: no 429 for them.
    assert client.get("/api/live").status_code == 401
    assert client.get("/api/live", headers={"Authorization": "Basic " + TOKEN}).status_code == 401
    clock.now += 1
    assert client.get("/api/live", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_failures_across_many_addresses_spend_one_global_budget_and_memory_stays_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    throttle = SignInThrottle(clock)
    with caplog.at_level(logging.WARNING, logger="tenure.apps.console"):
        for n in range(GLOBAL_FAILURE_BURST):
            assert throttle.retry_after(f"10.0.{n // 256}.{n % 256}") is None
            throttle.failed(f"10.0.{n // 256}.{n % 256}", "a bearer token")
    # The budget is spent: a fresh address waits too, until it refills.
    assert throttle.retry_after("192.0.2.1") == 1
    clock.now += 1 / GLOBAL_FAILURES_PER_SECOND
    assert throttle.retry_after("192.0.2.1") is None
    # The log was rate-limited; the next line after a quiet minute counts what it left out.
    assert len([record for record in caplog.records if "sign-in failed" in record.getMessage()]) == LOG_BURST
    clock.now += 60
    with caplog.at_level(logging.WARNING, logger="tenure.apps.console"):
        caplog.clear()
        throttle.failed("192.0.2.1", "the login form")
    assert f"{GLOBAL_FAILURE_BURST - LOG_BURST} more failed sign-ins were not logged" in caplog.records[0].getMessage()
    # Many more addresses than it remembers: it forgets the least recent, never grows past the bound.
    for n in range(MAX_TRACKED_CLIENTS + 500):
        throttle.failed(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}", "a bearer token")
        assert throttle.tracked <= MAX_TRACKED_CLIENTS
    assert throttle.tracked == MAX_TRACKED_CLIENTS
    # And forgets every address FORGET_AFTER_S after its last failure.
    clock.now += FORGET_AFTER_S + 1 + (MAX_TRACKED_CLIENTS + 600) / GLOBAL_FAILURES_PER_SECOND
    assert throttle.retry_after("192.0.2.1") is None and throttle.tracked == 0


def test_sign_in_comparisons_stay_constant_time_in_the_token() -> None:
    guard = Guard(TOKEN, b"k" * 32)
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(given: Any, expected: Any) -> bool:
        compared.append((given, expected))
        return real(given, expected)

    import unittest.mock

    with unittest.mock.patch("tenure.apps.console.security.hmac.compare_digest", spy):
        assert guard.token_matches(TOKEN) and not guard.token_matches("x" * 40)
        assert guard.bearer_matches("Bearer " + TOKEN) and not guard.bearer_matches("Bearer wrong")
    assert len(compared) == 4
