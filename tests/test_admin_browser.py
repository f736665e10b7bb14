"""The ops console in a real browser: Debian's Chromium, headless, driven by Selenium through
chromedriver against a live server. An operator logs in, replays one dead letter from its
page, tries to discard another with a blank reason and is refused, then discards it from
the change list's bulk action with a reason. Screenshots go to ``test-artifacts/browser/``.
An operator also opens the overview (the last hour, drawn as inline SVG) from the index;
its screenshot is ``test-artifacts/admin-overview.png``.

The browser is the ``browser`` fixture (tests/browser_fixtures.py).
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs.models import DeadLetter, DeadLetterState
from tests.browser_fixtures import navigate_by, shot, text_of
from tests.conftest import ROOT
from tests.factories.jobs import DeadLetterFactory
from tests.ops_support import OPERATOR_PERMS, staff_user
from tests.test_admin_overview import last_hour  # noqa: F401  (a fixture: a known last hour)

OVERVIEW_SHOT = ROOT / "test-artifacts" / "admin-overview.png"
PASSWORD = "pw-olga"  # staff_user's password for "olga"


@pytest.mark.django_db(transaction=True)
def test_an_operator_replays_and_discards_dead_letters_in_a_real_browser(browser, live_server, django_user_model):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    staff_user(django_user_model, "olga", *OPERATOR_PERMS)
    to_replay = DeadLetterFactory(correlation_id="corr-replay-me")
    to_discard = DeadLetterFactory(correlation_id="corr-discard-me", kind="sweep_expired", payload={})

    def go(path: str) -> None:
        browser.get(live_server.url + path)

    # Log in.
    go(reverse("admin:login"))
    browser.find_element(By.NAME, "username").send_keys("olga")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    navigate_by(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit]"))
    assert "Needs attention" in text_of(browser)
    assert browser.find_element(By.ID, "pending-review-count").text == "2"
    shot(browser, "01-admin-index")

    # Replay one from its page: confirmation first, then the act.
    go(reverse("admin:jobs_deadletter_change", args=[to_replay.pk]))
    assert "corr-replay-me" in text_of(browser)
    shot(browser, "02-dead-letter-detail")
    navigate_by(browser, browser.find_element(By.ID, "replay-this"))
    assert str(to_replay.job_id) in text_of(browser)
    shot(browser, "03-replay-confirmation")
    navigate_by(browser, browser.find_element(By.ID, "confirm-replay"))
    assert f"Replayed 1 dead letter: #{to_replay.pk}." in text_of(browser)
    shot(browser, "04-replayed")
    to_replay.refresh_from_db()
    assert (to_replay.state, to_replay.replayed_by) == (DeadLetterState.REPLAYED, "olga")

    # Try to discard the other with a blank reason: refused, nothing changes.
    go(reverse("admin:jobs_deadletter_change", args=[to_discard.pk]))
    navigate_by(browser, browser.find_element(By.ID, "discard-this"))
    browser.find_element(By.ID, "id_reason").send_keys("   ")
    navigate_by(browser, browser.find_element(By.ID, "confirm-discard"))
    assert "A reason is required to discard" in browser.find_element(By.ID, "reason-error").text
    shot(browser, "05-discard-refused-without-reason")
    to_discard.refresh_from_db()
    assert to_discard.state == DeadLetterState.PENDING_REVIEW

    # Discard it from the change list's bulk action, with a reason.
    go(reverse("admin:jobs_deadletter_changelist") + "?state__exact=pending_review")
    browser.find_element(By.CSS_SELECTOR, f"input[name=_selected_action][value='{to_discard.pk}']").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("discard_selected")
    navigate_by(browser, browser.find_element(By.CSS_SELECTOR, "button[name=index]"))
    reason = browser.find_element(By.ID, "id_reason")
    reason.clear()
    reason.send_keys("sweep superseded by the next hourly run")
    shot(browser, "06-discard-form")
    navigate_by(browser, browser.find_element(By.ID, "confirm-discard"))
    assert f"Discarded 1 dead letter: #{to_discard.pk}." in text_of(browser)
    shot(browser, "07-discarded")
    to_discard.refresh_from_db()
    assert (to_discard.state, to_discard.discarded_by, to_discard.discard_reason) == (
        DeadLetterState.DISCARDED,
        "olga",
        "sweep superseded by the next hourly run",
    )
    assert DeadLetter.objects.pending_review().count() == 0

    # Queue health: the depth summary above the live jobs (the replayed job is one of them).
    go(reverse("admin:jobs_job_changelist"))
    summary = browser.find_element(By.ID, "queue-summary").text
    assert "Queue depth" in summary and "default task 1 0 0" in summary
    shot(browser, "08-jobs-depth")


@pytest.mark.django_db(transaction=True)
def test_an_operator_opens_the_overview_from_the_index_and_sees_the_charts(
    browser, live_server, django_user_model, last_hour  # noqa: F811
):
    from selenium.webdriver.common.by import By

    staff_user(django_user_model, "olga", *OPERATOR_PERMS)
    browser.get(live_server.url + reverse("admin:login"))
    browser.find_element(By.NAME, "username").send_keys("olga")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    navigate_by(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit]"))
    navigate_by(browser, browser.find_element(By.LINK_TEXT, "The last hour, in charts"))
    assert browser.current_url.endswith(reverse("admin-overview"))
    assert browser.find_element(By.ID, "total-claimable").text == "3"
    assert browser.find_element(By.ID, "dead-letters-pending").text == "2"
    assert browser.find_element(By.ID, "failing-endpoints").text == "1"
    # The charts are drawn: every SVG has a size on the page and bars in it.
    svgs = browser.find_elements(By.CSS_SELECTOR, "svg.vpay-chart")
    assert len(svgs) == 7
    assert all(svg.size["width"] > 100 and svg.size["height"] > 10 for svg in svgs)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#overview-deliveries svg rect")) >= 5
    # No request left the live server (the page loads nothing from elsewhere).
    hosts = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => new URL(e.name).host)"
    )
    assert set(hosts) <= {live_server.url.split("//")[1]}
    browser.set_window_size(1400, 1300)
    OVERVIEW_SHOT.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(OVERVIEW_SHOT))
    assert OVERVIEW_SHOT.stat().st_size > 10_000  # a real picture of a page
