"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium, against ``reactor ui --write`` in a process.

Without the browser (``$REACTOR_CHROMIUM`` and ``$REACTOR_CHROMEDRIVER`` say where it
is, if not in /usr/bin) these tests skip, unless ``REACTOR_REQUIRE_BROWSER=1`` (as in
CI), where they fail. Screenshots go to ``$REACTOR_TEST_ARTIFACTS`` (default
``test-artifacts/``); with ``REACTOR_DOCS_SCREENSHOT=1`` the documentation's screenshot,
``docs/images/dashboard.png``, is taken again.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reactor
from tests._ui_support import start_cli, stop_cli, write_elsewhere
from tests.conftest import asgi_thread, wait_for

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.sqlite_only("one browser run is enough; the API is tested on both backends"),
]

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path(os.environ.get("REACTOR_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("REACTOR_CHROMEDRIVER", "/usr/bin/chromedriver"))
WAIT = 20.0  # seconds for the page to show something


def _artifacts() -> Path:
    folder = Path(os.environ.get("REACTOR_TEST_ARTIFACTS") or ROOT / "test-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A headless Chromium through the system's chromedriver; never a download."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        why = (
            f"the browser test needs {' and '.join(missing)} "
            "(apt-get install chromium chromium-driver)"
        )
        if os.environ.get("REACTOR_REQUIRE_BROWSER") == "1":
            pytest.fail(why + ", and REACTOR_REQUIRE_BROWSER=1")
        pytest.skip(why)
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must not fetch anything
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console's messages
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--hide-scrollbars",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _text(driver: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    text: str = driver.find_element(By.ID, element_id).text
    return text


def _until(driver: Any, element_id: str, wanted: str | Callable[[str], bool]) -> str:
    """Wait until the element's text holds ``wanted`` (or passes it); return the text."""

    def ok() -> str | None:
        text = _text(driver, element_id)
        passed = wanted(text) if callable(wanted) else wanted in text
        return text if passed else None

    found: str = wait_for(ok, timeout=WAIT, interval=0.05)
    return found


def _click(driver: Any, css: str, text: str | None = None) -> None:
    """Click the first element at ``css`` whose text holds ``text``, once there (the
    lists are drawn anew as changes come: an element found may be replaced)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def click() -> bool:
        try:
            for element in driver.find_elements(By.CSS_SELECTOR, css):
                if text is None or text in element.text:
                    element.click()
                    return True
        except StaleElementReferenceException:
            pass
        return False

    wait_for(click, timeout=WAIT, interval=0.05)


def _type(driver: Any, element_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def _show(driver: Any, scope: str, key: str, value_holds: str) -> None:
    """Pick ``scope`` and ``key`` in the lists; wait for the value to hold ``value_holds``."""
    _click(driver, "#scopes button", scope)
    _until(driver, "keys", key)
    _click(driver, "#keys button", key)
    _until(driver, "value", value_holds)


def _submit(
    driver: Any, field: str, text: str, button: str, says: str, kind: str | None = None
) -> None:
    """Fill ``field`` with ``text``, press ``button``, and wait for the message to say
    ``says`` (shown as ``kind``: "ok", "warn" or "error", if given)."""
    _type(driver, field, text)
    _click(driver, button)
    _until(driver, "message", says)
    if kind is not None:
        assert _class(driver, "message") == kind


def _class(driver: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    found: str = driver.find_element(By.ID, element_id).get_attribute("class") or ""
    return found


def _visible(driver: Any, element_id: str) -> bool:
    from selenium.webdriver.common.by import By

    shown: bool = driver.find_element(By.ID, element_id).is_displayed()
    return shown


def _in_order(*parts: str) -> Callable[[str], bool]:
    """A test of a text: it holds each of ``parts``, in this order."""

    def test(text: str) -> bool:
        at = 0
        for part in parts:
            at = text.find(part, at)
            if at < 0:
                return False
        return True

    return test


def test_the_page_follows_another_process_and_edits_a_value(
    browser: Any, db_path: Any, tmp_path: Path
) -> None:
    with reactor.open(db_path) as state:
        state.scope("orders").set("o-1", {"total": 120, "status": "new"})
    process, url, _ = start_cli(db_path, "--write", cwd=tmp_path)
    try:
        browser.get(url)
        _until(browser, "connection", "live")
        _until(browser, "mode", "read-write")
        _until(browser, "scopes", "orders")

        # A key written by another process appears in the feed, and in the key list.
        write_elsewhere(db_path, 'state.scope("orders").set("o-42", {"total": 99})')
        row = _until(browser, "feed", "o-42")
        assert "created" in row
        assert '{"total":99}' in row
        _click(browser, "#scopes button", "orders")
        _until(browser, "keys", "o-42")
        _type(browser, "key-pattern", "o-4*")
        _until(browser, "keys", lambda text: text.split() == ["o-42"])

        # Edit it from the page: the database has it.
        _click(browser, "#keys button", "o-42")
        _until(browser, "value", '"total": 99')
        _submit(browser, "edit-value", '{"total": 100.0, "status": "paid"}', "#do-set", "saved")
        with reactor.open(db_path) as state:
            assert state.scope("orders").get("o-42") == {"total": 100.0, "status": "paid"}
            assert isinstance(state.scope("orders").get("o-42")["total"], float)
        _until(browser, "value", '"total": 100.0')
        # The feed shows what changed, and a float as a float.
        _until(browser, "feed", "replace /total 99 → 100.0")
        _until(browser, "feed", 'add /status "paid"')

        # Update ops from the page.
        increment = '{"type": "increment", "path": "total", "by": 5}'
        _submit(browser, "edit-ops", increment, "#do-update", "updated", "ok")
        with reactor.open(db_path) as state:
            assert state.scope("orders").get("o-42") == {"total": 105.0, "status": "paid"}

        # The key's history, newest first: each change with what it did.
        _until(
            browser,
            "history",
            _in_order("#4", "replace /total 100.0 → 105.0", "#3", "#2", "created"),
        )
        assert "orders / o-42" in _text(browser, "history-where")

        # An all-or-nothing update that fails is a failure, with its errors.
        failing = (
            '[{"type": "set", "path": "status", "value": "x"}, '
            '{"type": "increment", "path": "status"}]'
        )
        _submit(browser, "edit-ops", failing, "#do-update", "not updated", "error")
        assert "type_mismatch" in _text(browser, "message")
        with reactor.open(db_path) as state:
            assert state.scope("orders").get("o-42") == {"total": 105.0, "status": "paid"}

        # reactor's typed errors are shown, and nothing is written.
        _submit(browser, "edit-ttl", "-5", "#do-set", "InvalidArgumentError")
        _type(browser, "edit-ttl", "")
        mixed = '[{"op": "remove", "path": "/total"}, {"type": "set", "path": "a", "value": 1}]'
        _submit(browser, "edit-ops", mixed, "#do-update", "InvalidOpError")
        _submit(browser, "edit-value", "paid", "#do-set", "not JSON")
        with reactor.open(db_path) as state:
            assert state.scope("orders").get("o-42") == {"total": 105.0, "status": "paid"}

        # Without all or nothing, the ops that apply do: a warning, not a success.
        _click(browser, "#edit-atomic")
        _submit(browser, "edit-ops", failing, "#do-update", "updated in part", "warn")
        assert "type_mismatch" in _text(browser, "message")
        with reactor.open(db_path) as state:
            assert state.scope("orders").get("o-42") == {"total": 105.0, "status": "x"}
        browser.save_screenshot(str(_artifacts() / "dashboard-edit.png"))

        # Delete asks first: Cancel deletes nothing.
        assert not _visible(browser, "delete-confirm")
        _click(browser, "#do-delete")
        _until(browser, "delete-question", "Delete o-42 from orders?")
        assert _visible(browser, "delete-confirm")
        with reactor.open(db_path) as state:
            assert state.scope("orders").exists("o-42")  # not yet
        _click(browser, "#delete-no")
        _until(browser, "message", "not deleted")
        assert not _visible(browser, "delete-confirm")
        with reactor.open(db_path) as state:
            assert state.scope("orders").exists("o-42")
        # Yes deletes the key named when asked.
        _click(browser, "#do-delete")
        _until(browser, "delete-question", "o-42")
        _click(browser, "#delete-yes")
        _until(browser, "message", lambda text: text == "deleted")
        assert _class(browser, "message") == "ok"
        with reactor.open(db_path) as state:
            assert not state.scope("orders").exists("o-42")
        _until(browser, "feed", 'was {"total":105.0,"status":"x"}')
        _until(browser, "history", _in_order("#6", "deleted", "#5", "updated"))
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err


# Run in another process: a durable subscriber that reads the first two changes and
# stops, and a lock taken and never released (its lease outlives the process).
MAILER_AND_LOCK = """
import threading

read = threading.Event()
seen = []

def deliver(event):
    seen.append(event.revision)
    if len(seen) == 2:
        read.set()

subscription = state.subscribe(deliver, durable="mailer", since=0)
assert read.wait(30)
subscription.close()
state.lock("nightly-report", ttl=600).acquire()
"""


def test_the_page_shows_the_locks_held_and_the_subscribers_lag(
    browser: Any, db_path: Any, tmp_path: Path
) -> None:
    with reactor.open(db_path) as state:
        state.scope("orders").set("o-1", 1)
        state.scope("orders").set("o-2", 2)
    process, url, _ = start_cli(db_path, cwd=tmp_path)
    try:
        browser.get(url)
        _until(browser, "connection", "live")
        _until(browser, "locks-empty", "No lock held.")
        _until(browser, "subscribers-empty", "No durable subscriber.")
        write_elsewhere(db_path, MAILER_AND_LOCK)
        write_elsewhere(db_path, 'for n in range(3): state.scope("orders").set("o-1", n + 5)')
        # name, position, lag (the revision, 5, minus the position), delivered, failed
        _until(browser, "subscribers", lambda text: "mailer #2 3 2 0" in " ".join(text.split()))
        assert not _visible(browser, "subscribers-empty")
        # name, holder, token, time left
        lock = _until(browser, "locks", "nightly-report")
        row = lock.splitlines()[-1].split()
        assert row[0] == "nightly-report"
        assert row[2] == "1"
        assert 590 < float(row[3]) <= 600
        assert row[4] == "s"
        assert not _visible(browser, "locks-empty")
        _until(browser, "stats", lambda text: "locks held 1" in " ".join(text.split()))
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err


# Run in another process, which closes before the first is due: a timer that will come
# due with no process that writes to fire it, one to cancel, and a recurring one.
SCHEDULE = """
import time

jobs = state.scope("jobs")
jobs.schedule("j-1", ops=[{"type": "increment", "path": "tries"}], at=time.time() + 1)
jobs.schedule("report", {"state": "late", "rate": 1.0}, after=600)
state.scope("health").schedule("beats", ops=[{"type": "increment", "path": ""}], every=3600)
"""


def _timer_row(driver: Any, timer_id: str) -> str:
    """The text of the timers panel's row for ``timer_id`` ("" if none)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        found = driver.find_elements(By.CSS_SELECTOR, f'#timers tr[data-id="{timer_id}"]')
        return " ".join(found[0].text.split()) if found else ""
    except StaleElementReferenceException:
        return ""  # drawn anew meanwhile


def _attribute(driver: Any, css: str, name: str) -> str:
    """The attribute ``name`` of the element at ``css``, once there."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def read() -> str | None:
        try:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            return found[0].get_attribute(name) if found else None
        except StaleElementReferenceException:
            return None

    value: str = wait_for(read, timeout=WAIT, interval=0.05)
    return value


def test_the_page_shows_the_timers_marks_their_writes_and_cancels_one(
    browser: Any, db_path: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    with reactor.open(db_path) as state:
        state.scope("jobs").set("j-1", {"tries": 0})
    # Read-only, the dashboard fires no timer: a process that writes does.
    process, url, _ = start_cli(db_path, cwd=tmp_path)
    try:
        browser.get(url)
        _until(browser, "connection", "live")
        _until(browser, "timers-empty", "No timer pending.")
        write_elsewhere(db_path, SCHEDULE)
        with reactor.open(db_path) as state:
            retry, report, beat = state.timers()
        assert [timer.key for timer in (retry, report, beat)] == ["j-1", "report", "beats"]

        # Earliest first, each with its due time (local), how soon, what it writes.
        _until(browser, "timers", _in_order("j-1", "report", "beats"))
        due = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.due))
        row = wait_for(lambda: _timer_row(browser, report.id), timeout=WAIT)
        assert row.startswith((due + " in 9 min", due + " in 10 min")), row
        assert 'jobs report set {"state":"late","rate":1.0} once ' + report.id[:8] in row
        row = _timer_row(browser, beat.id)
        assert 'health beats update [{"type":"increment","path":""}] every 1 h' in row
        # No process that writes has the database open: the first one stays, overdue.
        wait_for(lambda: "overdue" in _timer_row(browser, retry.id), timeout=WAIT)
        _until(browser, "timers-figures", "3 pending · fired here 0 · failed here 0")
        assert browser.find_elements(By.CSS_SELECTOR, "#timers button") == []  # read-only

        # A process that writes opens the database: the timer fires. Its change is marked
        # in the feed, with the timer's id on hover, and it leaves the panel.
        write_elsewhere(
            db_path,
            'assert state.scope("jobs").wait_for("j-1", lambda job: job["tries"] == 1, timeout=30)',
        )
        badge = f'#feed tr[data-timer="{retry.id}"] .tag'
        assert _attribute(browser, badge, "title") == f"written by the timer {retry.id}"
        assert "timer" in _text(browser, "feed")
        wait_for(lambda: _timer_row(browser, retry.id) == "", timeout=WAIT)
        _until(browser, "timers-figures", "2 pending")

        # The key's versions, and its history: each change's version, the timer's marked.
        with reactor.open(db_path) as state:
            entry = state.scope("jobs").entry("j-1")
        assert entry is not None
        _show(browser, "jobs", "j-1", '"tries": 1')
        _until(
            browser,
            "value-version",
            f"version 2 · revision #{entry.revision} · created at #{entry.created_revision}",
        )
        history = _until(browser, "history", _in_order(f"#{entry.revision}", "updated", "v2"))
        assert "v1" in history
        assert _attribute(browser, "#history .tag", "title") == f"written by the timer {retry.id}"
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err

    # With --write: a button cancels a timer, after asking.
    process, url, _ = start_cli(db_path, "--write", cwd=tmp_path)
    try:
        browser.get(url)
        _until(browser, "mode", "read-write")
        button = f'#timers tr[data-id="{report.id}"] button'
        _click(browser, button)
        _until(browser, "timer-question", f"Cancel the timer {report.id} (jobs / report)?")
        assert _visible(browser, "timer-confirm")
        _click(browser, "#timer-no")
        _until(browser, "timers-message", "not cancelled")
        assert not _visible(browser, "timer-confirm")
        with reactor.open(db_path) as state:
            assert [timer.id for timer in state.timers()] == [report.id, beat.id]
        _click(browser, button)
        _until(browser, "timer-question", report.id)
        _click(browser, "#timer-yes")
        _until(browser, "timers-message", f"cancelled the timer {report.id}")
        assert _class(browser, "timers-message") == "message ok"
        wait_for(lambda: _timer_row(browser, report.id) == "", timeout=WAIT)
        assert "beats" in _timer_row(browser, beat.id)
        with reactor.open(db_path) as state:
            assert state.timers() == [beat]
        browser.save_screenshot(str(_artifacts() / "dashboard-timers.png"))
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err


# Run in another process: a worker that takes the jobs of queue "emails" (max_attempts
# 2), acks two, gives one back until it is dead, and keeps the last one (its lease
# outlives the process).
WORKER = """
emails = state.queue("emails")
first = emails.take(timeout=5)
assert first.item == {"to": "ada@example.com"}
first.ack()
bounced = emails.take(timeout=5)
bounced.nack()  # attempt 1 of 2: ready again, behind the third
emails.take(timeout=5).ack()
again = emails.take(timeout=5)
assert (again.item, again.attempts) == ({"to": "bob@example"}, 2)
again.nack(error="Traceback (most recent call last):\\nSMTPRecipientsRefused: bob@example")
emails.put({"to": "eve@example.com"})
assert emails.take(timeout=5, lease=600).item == {"to": "eve@example.com"}
"""


# Counts the page's requests for the queues' listing, in window.queueFetches.
COUNT_FETCHES = """
window.queueFetches = 0;
const original = window.fetch;
window.fetch = (resource, ...rest) => {
  if (String(resource).startsWith("api/queues")) window.queueFetches += 1;
  return original(resource, ...rest);
};
"""


def _queue_row(driver: Any, name: str) -> str:
    """The text of the queues panel's row for queue ``name`` ("" if none)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        found = driver.find_elements(By.CSS_SELECTOR, f'#queues tr[data-queue="{name}"]')
        return " ".join(found[0].text.split()) if found else ""
    except StaleElementReferenceException:
        return ""  # drawn anew meanwhile


def _figures(text: str) -> str:
    return " ".join(text.split())


def test_the_page_shows_the_queues_their_dead_letters_and_retries_them(
    browser: Any, db_path: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    with reactor.open(db_path) as state:
        state.scope("orders").set("o-1", 1)
    process, url, _ = start_cli(db_path, cwd=tmp_path)
    try:
        browser.get(url)
        _until(browser, "connection", "live")
        _until(browser, "queues-empty", "No queue.")
        # Filled by another process: name, ready, delayed, taken, dead, max attempts,
        # how long the first in line has waited.
        write_elsewhere(
            db_path,
            """
            emails = state.queue("emails", max_attempts=2, concurrency=5)
            for to in ("ada@example.com", "bob@example", "cy@example.com"):
                emails.put({"to": to})
            emails.put({"to": "later@example.com"}, delay=600)
            """,
        )
        row = wait_for(lambda: _queue_row(browser, "emails"), timeout=WAIT)
        assert row.startswith("emails 3 1 0 0 2 ≤5 taken "), row
        assert row.endswith(" s"), row
        _until(browser, "stats", lambda text: "queues 1 dead letters 0" in _figures(text))
        # Worked by another: the counts change, a dead letter appears.
        write_elsewhere(db_path, WORKER)
        done = "emails 0 1 1 1 2 ≤5 taken —"
        wait_for(lambda: _queue_row(browser, "emails") == done, timeout=WAIT)
        _until(browser, "stats", lambda text: "queues 1 dead letters 1" in _figures(text))
        _until(browser, "queues-figures", "1 queue · 1 dead letter")
        assert not _visible(browser, "dead-letters")
        _click(browser, '#queues tr[data-queue="emails"] button.name')
        dead = _until(browser, "dead", "bob@example")
        died = _figures(dead.splitlines()[-1])
        assert died.startswith('2 {"to":"bob@example"} 2 ' + time.strftime("%Y-%m-%d")), died
        # Why it died: the last line of its last error (all of it in the title).
        assert died.endswith("SMTPRecipientsRefused: bob@example"), died
        title = _attribute(browser, '#dead tr[data-id="2"] td:nth-child(5)', "title")
        assert title.startswith("Traceback"), title
        assert _attribute(browser, '#dead tr[data-id="2"] td:nth-child(2)', "title") == (
            '{"to":"bob@example"}'
        )
        assert browser.find_elements(By.CSS_SELECTOR, "#queues button.danger") == []  # read-only
        # Clicked again, the queue's dead letters fold away.
        _click(browser, '#queues tr[data-queue="emails"] button.name')
        wait_for(lambda: not _visible(browser, "dead-letters"), timeout=WAIT)

        # A burst of 1,000 job events refreshes the panel a few times, not 1,000.
        browser.execute_script(COUNT_FETCHES)
        write_elsewhere(db_path, 'for n in range(1000): state.queue("bulk").put(n)')
        wait_for(lambda: _queue_row(browser, "bulk").startswith("bulk 1000 0 0 0 5 "), WAIT)
        # The jobs' changes are hidden from the feed until asked for.
        _until(browser, "feed-note", "changes hidden by the filters")
        assert "queue:bulk" not in _text(browser, "feed")
        _click(browser, "#feed-internal")
        _until(browser, "feed", "queue:bulk")
        fetched = browser.execute_script("return window.queueFetches")
        assert 1 <= fetched <= 30, fetched
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err

    # With --write: a button retries a queue's dead letters, after asking.
    process, url, _ = start_cli(db_path, "--write", cwd=tmp_path)
    try:
        browser.get(url)
        _until(browser, "mode", "read-write")
        button = '#queues tr[data-queue="emails"] button.danger'
        _click(browser, button)
        _until(
            browser,
            "retry-question",
            "Retry the 1 dead letter of queue emails? They become ready again",
        )
        assert _visible(browser, "retry-confirm")
        _click(browser, "#retry-no")
        _until(browser, "queues-message", "not retried")
        assert not _visible(browser, "retry-confirm")
        with reactor.open(db_path) as state:
            assert state.queue("emails").stats()["dead"] == 1
        _click(browser, '#queues tr[data-queue="emails"] button.name')
        _until(browser, "dead", "bob@example")
        _click(browser, button)
        _until(browser, "retry-question", "emails")
        _click(browser, "#retry-yes")
        _until(browser, "queues-message", "retried 1 dead letter of emails")
        assert _class(browser, "queues-message") == "message ok"
        wait_for(lambda: _queue_row(browser, "emails").startswith("emails 1 1 1 0 2 "), WAIT)
        _until(browser, "dead-note", "No dead letter.")
        _click(browser, "#feed-internal")
        _until(browser, "feed", "queue:emails")
        assert _attribute(browser, button, "disabled") == "true"  # nothing left to retry
        with reactor.open(db_path) as state:
            emails = state.queue("emails")
            assert emails.stats() == {
                "ready": 1,
                "delayed": 1,
                "taken": 1,
                "dead": 0,
                "taken_by_group": {},
                "rate_window": 0,
            }
            job = emails.take(timeout=0)
            assert job is not None
            assert (job.item, job.attempts) == ({"to": "bob@example"}, 1)
        browser.save_screenshot(str(_artifacts() / "dashboard-queues.png"))
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err


def test_the_page_looks_a_job_up_cancels_it_and_purges_dead_letters(
    browser: Any, db_path: Any, tmp_path: Path
) -> None:
    write_elsewhere(
        db_path,
        """
        emails = state.queue("emails", max_attempts=2)
        for to in ("ada@example.com", "bob@example", "cy@example.com"):
            emails.put({"to": to})
        """,
    )
    write_elsewhere(db_path, WORKER)  # 2 dies (bob), 4 (eve) stays taken
    from selenium.webdriver.common.by import By

    process, url, _ = start_cli(db_path, cwd=tmp_path)
    try:
        browser.get(url)
        _click(browser, '#queues tr[data-queue="emails"] button.name')
        _until(browser, "dead", "bob@example")
        assert not _visible(browser, "purge-dead")  # read-only
        # A dead letter's id shows the job: its state, attempts and each attempt's error.
        _click(browser, '#dead tr[data-id="2"] button.name')
        fields = _figures(_until(browser, "job-fields", "dead"))
        assert 'state dead item {"to":"bob@example"} attempts 2 of 2' in fields, fields
        _until(browser, "job-errors", "SMTPRecipientsRefused")
        attempts = browser.find_elements(By.CSS_SELECTOR, "#job-errors tbody tr")
        assert [row.text.split()[0] for row in attempts] == ["1", "2"]
        assert not _visible(browser, "cancel-job")  # read-only
        # Any job, by its id: the taken one, and one that does not exist.
        _type(browser, "job-id", "4")
        _click(browser, "#job-lookup button[type=submit]")
        _until(browser, "job-fields", "taken")
        assert "eve@example.com" in _text(browser, "job-fields")
        _type(browser, "job-id", "99")
        _click(browser, "#job-lookup button[type=submit]")
        _until(browser, "job-message", "NotFound: no job 99 in queue 'emails'")
        assert not _visible(browser, "job")
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err

    process, url, _ = start_cli(db_path, "--write", cwd=tmp_path)
    try:
        browser.get(url)
        _until(browser, "mode", "read-write")
        _click(browser, '#queues tr[data-queue="emails"] button.name')
        _until(browser, "dead", "bob@example")
        _type(browser, "job-id", "4")
        _click(browser, "#job-lookup button[type=submit]")
        _until(browser, "job-fields", "taken")
        _click(browser, "#cancel-job")
        _until(browser, "job-question", "Cancel job 4 of queue emails (taken)?")
        _click(browser, "#job-no")
        _until(browser, "job-message", "nothing changed")
        _click(browser, "#cancel-job")
        _click(browser, "#job-yes")
        _until(browser, "job-message", "cancelled job 4 of emails")
        assert not _visible(browser, "job")
        _click(browser, "#purge-dead")
        _until(browser, "job-question", "Purge the dead letters of queue emails?")
        _click(browser, "#job-yes")
        _until(browser, "job-message", "purged 1 dead letter of emails")
        _until(browser, "dead-note", "No dead letter.")
        with reactor.open(db_path) as state:
            emails = state.queue("emails")
            assert emails.job(4) is None
            assert emails.job(2) is None
            assert emails.stats()["dead"] == 0
            assert emails.stats()["taken"] == 0
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err


def test_a_screenshot_with_realistic_data(browser: Any, db_path: Any, tmp_path: Path) -> None:
    """The documentation's picture: orders, a counter, a cached rate and its history, a
    durable subscriber behind, a lock held, timers pending, queues with a dead letter,
    a live feed with a timer's write."""
    with reactor.open(db_path) as state:
        orders = state.scope("orders")
        for n, (total, status) in enumerate([(120, "paid"), (80, "new"), (310, "shipped")]):
            order = {"customer": f"c-{7 + n}", "total": total, "status": status}
            orders.set(f"o-{1001 + n}", order)
        orders.increment("count", 3)
        cache = state.scope("cache")
        cache.set("eur-usd", {"rate": 1.0842, "source": "ecb", "at": "2026-11-23T11:58Z"}, ttl=3600)
        cache.set("gbp-usd", {"rate": 1.2715, "source": "ecb", "at": "2026-11-23T11:58Z"}, ttl=3600)
        cache.set("session:7f3a", {"user": "c-8", "cart": ["sku-1", "sku-9"]}, ttl=900)
        state.scope("jobs").set("nightly-report", {"state": "queued", "attempts": 0})
        orders.schedule(
            "o-1002", ops=[{"type": "set", "path": "status", "value": "timed out"}], after=1800
        )
        state.scope("health").schedule("beats", ops=[{"type": "increment", "path": ""}], every=60)
        tonight = time.time() + 6 * 3600
        queued = {"state": "queued", "attempts": 0}
        state.scope("jobs").schedule("nightly-report", queued, at=tonight)
        emails = state.queue("emails", max_attempts=3)
        emails.put({"to": "c-9@example", "template": "receipt", "order": "o-1003"})
        for _ in range(3):  # a bounced address: dead after its third attempt
            job = emails.take(timeout=0)
            assert job is not None
            job.nack()
        for n, customer in enumerate(["c-7", "c-8", "c-12", "c-7"]):
            receipt = {"to": f"{customer}@example.com", "template": "receipt"}
            emails.put({**receipt, "order": f"o-{1001 + n}"})
        emails.put({"to": "c-8@example.com", "template": "reminder"}, delay=3600)
        working = emails.take(timeout=0, lease=600)  # a worker's, under its lease
        assert working is not None
        state.queue("webhooks").put({"url": "https://shop.example/hooks/paid", "order": "o-1002"})
    write_elsewhere(db_path, MAILER_AND_LOCK)
    process, url, _ = start_cli(db_path, cwd=tmp_path)
    try:
        browser.get(url)
        _until(browser, "connection", "live")
        write_elsewhere(
            db_path,
            """
            orders = state.scope("orders")
            orders.set("o-1004", {"customer": "c-12", "total": 45, "status": "new"})
            orders.increment("count")
            orders.update("o-1002", [{"type": "set", "path": "status", "value": "paid"}])
            remind = [{"type": "set", "path": "status", "value": "reminded"}]
            orders.schedule("o-1004", ops=remind, after=0.1)  # fired here: a timer's write
            orders.wait_for("o-1004", lambda order: order["status"] == "reminded", timeout=30)
            state.scope("jobs").update("nightly-report", [
                {"type": "set", "path": "state", "value": "running"},
                {"type": "increment", "path": "attempts"},
            ])
            state.scope("cache").update(
                "eur-usd", [{"type": "set", "path": "rate", "value": 1.0851}]
            )
            orders.delete("o-1003")
            """,
        )
        _until(browser, "feed", "o-1003")
        _show(browser, "orders", "o-1002", '"status": "paid"')
        _until(browser, "keys", "o-1004")
        _until(browser, "value-ttl", "no expiry")
        _show(browser, "cache", "eur-usd", "1.0851")
        _until(browser, "value-ttl", "expires in")
        _until(browser, "history", "replace /rate 1.0842 → 1.0851")
        _until(browser, "subscribers", "mailer")
        _until(browser, "locks", "nightly-report")
        _until(browser, "timers", _in_order("beats", "o-1002", "nightly-report"))
        _until(browser, "feed", "timer")
        _until(browser, "stats", "revision")
        wait_for(lambda: _queue_row(browser, "emails").startswith("emails 3 1 1 1 3 "), WAIT)
        _click(browser, '#queues tr[data-queue="emails"] button.name')
        _until(browser, "dead", "c-9@example")
        _until(browser, "stats", lambda text: "dead letters 1" in _figures(text))
        if os.environ.get("REACTOR_DOCS_SCREENSHOT") == "1":  # charts of two samples or more
            from selenium.webdriver.common.by import By

            def rated() -> bool:
                now = browser.find_element(By.CSS_SELECTOR, "#chart-writes .now").text
                return now.startswith("now:") and "—" not in now

            wait_for(rated, timeout=30)
        # The panels, without the empty page below.
        height = browser.execute_script(
            "return document.documentElement.scrollHeight + window.outerHeight - window.innerHeight"
        )
        browser.set_window_size(1400, height)
        picture = _artifacts() / "dashboard.png"
        browser.save_screenshot(str(picture))
        if os.environ.get("REACTOR_DOCS_SCREENSHOT") == "1":
            shutil.copyfile(picture, ROOT / "docs" / "images" / "dashboard.png")
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err


def test_the_page_shows_the_runs_their_steps_live_and_cancels_one(
    browser: Any, db_path: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    with reactor.open(db_path) as state:
        state.scope("orders").set("o-1", 1)
    process, url, _ = start_cli(db_path, "--write", cwd=tmp_path)
    try:
        browser.get(url)
        _until(browser, "connection", "live")
        _until(browser, "runs-empty", "No run.")
        # Runs worked by another process: one succeeds, one fails, one waits.
        write_elsewhere(
            db_path,
            """
            @state.workflow("order")
            def order(run, spec):
                run.step("reserve", lambda: spec)
                if spec == "bad":
                    run.step("charge", lambda: 1 / 0)
                if spec == "wait":
                    run.receive("approval")
                return "done"

            handles = [state.start("order", spec, id=spec) for spec in ("ok", "bad", "wait")]
            with state.serve():
                for handle in handles[:2]:
                    try:
                        handle.result(timeout=20)
                    except reactor.WorkflowFailedError:
                        pass
                while handles[2].status() != "suspended":
                    pass
            """,
        )
        _until(browser, "runs-figures", "3 runs · 1 failed")
        listed = _text(browser, "runs")
        assert _in_order("wait", "order", "suspended")(listed), listed
        assert _in_order("bad", "order", "failed", "StepFailedError")(listed), listed
        _click(browser, "#runs button.name", "bad")
        steps = _until(browser, "run-steps", "charge")
        assert _in_order("reserve", "succeeded", "charge", "failed", "ZeroDivisionError")(steps)
        bars = browser.find_elements(By.CSS_SELECTOR, "#run-steps .bar.bad")
        assert len(bars) == 1
        # The waiting run: its step is drawn as waiting, and it is cancelled from here.
        _click(browser, "#runs button.name", "wait")
        _until(browser, "run-steps", "receive:approval")
        assert browser.find_elements(By.CSS_SELECTOR, "#run-steps .bar.waiting")
        _click(browser, "#cancel-run")
        _click(browser, "#run-yes")
        _until(browser, "run-message", "cancelled wait")
        _until(browser, "run-fields", "cancelled")
    finally:
        _, err = stop_cli(process)
    assert process.returncode == 0, err
    with reactor.open(db_path) as state:
        assert state.run("wait").status() == "cancelled"


# -- the public app, mounted under a prefix: charts, the feed's filters, a job's detail --
def _mounted(state: reactor.State) -> Any:
    """The user's Starlette app with the dashboard at /reactor/ (sampling every 0.3 s)."""
    import contextlib

    from starlette.applications import Starlette
    from starlette.routing import Mount

    from reactor.ui import create_app

    dashboard = create_app(state, sample_every=0.3)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> Any:
        async with dashboard.router.lifespan_context(dashboard):
            yield

    return Starlette(routes=[Mount("/reactor", app=dashboard)], lifespan=lifespan)


def _fail_a_job(state: reactor.State) -> int:
    """A job of queue "mail" dead after one attempt that raised: its id."""
    mail = state.queue("mail", max_attempts=1)
    mail.put({"to": "bob@example"})
    job = mail.take(timeout=0)
    assert job is not None
    try:
        _connect()
    except ConnectionRefusedError as exc:
        job.nack(error=exc)
    return job.id


def _connect() -> None:
    raise ConnectionRefusedError("smtp.example refused the connection")


def _console_errors(driver: Any) -> list[Any]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def test_the_mounted_page_charts_filters_the_feed_and_opens_a_job(
    browser: Any, db_path: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    with reactor.open(db_path) as state, asgi_thread(_mounted(state)) as url:
        browser.get(url + "reactor/")
        _until(browser, "connection", "live")
        # The charts: uPlot draws each on a canvas, and says the last figures.
        _until(browser, "chart-queues", "No queue.")
        canvases = browser.find_elements(By.CSS_SELECTOR, "#charts canvas")
        assert len(canvases) >= 4
        assert all(canvas.size["width"] > 100 for canvas in canvases)

        # A write shows in the feed with its time, local, the full date on hover.
        state.scope("orders").set("o-1", {"total": 120})
        _until(browser, "feed", "orders")
        cell = browser.find_element(By.CSS_SELECTOR, "#feed tbody tr:first-child td.time")
        assert re.fullmatch(r"\d\d:\d\d:\d\d", cell.text), cell.text
        assert time.strftime("%Y-%m-%d") in (cell.get_attribute("title") or "")

        # A job's changes (scope queue:mail) are hidden until asked for.
        job_id = _fail_a_job(state)
        _until(browser, "feed-note", "hidden by the filters")
        assert "queue:mail" not in _text(browser, "feed")
        _click(browser, "#feed-internal")
        _until(browser, "feed", "queue:mail")
        # The type filter: updates only (the job's; the order was created).
        Select(browser.find_element(By.ID, "feed-type")).select_by_visible_text("updated")
        wait_for(lambda: "orders" not in _text(browser, "feed"), timeout=WAIT)
        assert "queue:mail" in _text(browser, "feed")
        _until(browser, "chart-queues", "now: mail 0 jobs")

        # A job's key in the feed opens its detail: state, attempts, error, traceback.
        _click(browser, '#feed tr[data-internal="1"] button.name', str(job_id))
        fields = _figures(_until(browser, "job-fields", "dead"))
        assert 'state dead item {"to":"bob@example"} attempts 1 of 1' in fields, fields
        assert "taken by" not in fields  # dead: no worker holds it
        _until(browser, "job-errors", "ConnectionRefusedError: smtp.example refused")
        _click(browser, "#job-errors summary")
        trace = browser.find_element(By.CSS_SELECTOR, "#job-errors pre.traceback")
        wait_for(trace.is_displayed, timeout=WAIT)
        assert trace.text.startswith("Traceback"), trace.text
        assert "_fail_a_job" in trace.text

        # A run's key in the feed opens it in the runs panel.
        Select(browser.find_element(By.ID, "feed-type")).select_by_visible_text("any")
        state.start("nightly", {"day": 1}, id="r-1")  # recorded; no worker takes it
        _until(browser, "feed", "run:nightly")
        _click(browser, '#feed tr[data-internal="1"] button.name', "r-1")
        _until(browser, "run-where", "r-1")
        _until(browser, "run-fields", "pending")

        assert _console_errors(browser) == []
        browser.get("about:blank")  # the feed closes before the server stops
