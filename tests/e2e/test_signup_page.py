"""The signup page as a person on a phone uses it, in headless Chromium."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.conftest import queued_messages
from tests.e2e.conftest import screenshot

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def fill(page: Any, **values: str) -> None:
    for field, value in values.items():
        page.get_by_label(field, exact=True).fill(value)


def test_a_person_fixes_a_mistake_and_signs_up(live_server: Any, page: Any) -> None:
    page.goto(f"{live_server.url}/accounts/signup/")
    fill(page, Username="ada", Email="not-an-email", Password="correct-horse-9")
    page.get_by_label("Password confirmation").fill("different-horse-9")
    page.get_by_role("button", name="Sign up").click()

    # Errors sit beside their fields and the typed values are kept.
    assert page.locator("#id_email_errors").inner_text() == "Enter a valid email address."
    assert "match" in page.locator("#id_password2_errors").inner_text()
    assert page.get_by_label("Username").input_value() == "ada"
    screenshot(page, "signup-errors")

    fill(page, Email="ada@example.com", Password="correct-horse-9")
    page.get_by_label("Password confirmation").fill("correct-horse-9")
    page.get_by_role("button", name="Sign up").click()

    page.wait_for_url("**/accounts/signup/done/")
    assert page.get_by_role("heading").inner_text() == "Check your inbox"
    assert "ada@example.com" in page.content()
    screenshot(page, "signup-done")
    assert User.objects.filter(username="ada").exists()
    assert len(queued_messages("emails")) == 1


def test_the_form_fits_a_phone_screen(live_server: Any, page: Any) -> None:
    page.goto(f"{live_server.url}/accounts/signup/")

    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, "the page scrolls sideways on a 390 px wide phone"
    assert page.evaluate("getComputedStyle(document.body).fontFamily")
    screenshot(page, "signup-form")
