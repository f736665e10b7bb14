"""charges/money.py: each currency's exponent, bounds and formatting, over the zero-,
two- and three-decimal currencies the issue names; and the startup check of
VPAY_CURRENCIES. No database."""

from __future__ import annotations

import pytest

from charges import money
from charges.checks import charge_config_problems
from vpay.errors import InvalidInput

NBSP = "\u00a0"

# currency, exponent, 2500 minor units, the smallest and the largest amount as they read.
TABLE = [
    ("usd", 2, "$25.00", "$0.01", "$10,000,000,000.00"),
    ("eur", 2, "€25.00", "€0.01", "€10,000,000,000.00"),
    ("gbp", 2, "£25.00", "£0.01", "£10,000,000,000.00"),
    ("jpy", 0, "¥2,500", "¥1", "¥1,000,000,000,000"),
    ("krw", 0, "₩2,500", "₩1", "₩1,000,000,000,000"),
    ("xof", 0, f"F\u202fCFA{NBSP}2,500", f"F\u202fCFA{NBSP}1", f"F\u202fCFA{NBSP}1,000,000,000,000"),
    ("bhd", 3, f"BHD{NBSP}2.500", f"BHD{NBSP}0.001", f"BHD{NBSP}1,000,000,000.000"),
    ("kwd", 3, f"KWD{NBSP}2.500", f"KWD{NBSP}0.001", f"KWD{NBSP}1,000,000,000.000"),
    ("tnd", 3, f"TND{NBSP}2.500", f"TND{NBSP}0.001", f"TND{NBSP}1,000,000,000.000"),
]


@pytest.mark.parametrize(("currency", "exponent", "sample", "smallest", "largest"), TABLE)
def test_each_currency_has_its_exponent_bounds_and_format(currency, exponent, sample, smallest, largest):
    assert money.exponent(currency) == money.exponent(currency.upper()) == exponent
    assert money.format_amount(2500, currency) == sample
    low, high = money.amount_bounds(currency)
    assert (low, high) == (1, 10**12)
    assert (money.format_amount(low, currency), money.format_amount(high, currency)) == (smallest, largest)
    accepted = {amount: money.within_bounds(amount, currency) for amount in (low - 1, low, high, high + 1)}
    assert accepted == {low - 1: False, low: True, high: True, high + 1: False}


@pytest.mark.parametrize(("currency", "exponent", "sample", "smallest", "largest"), TABLE)
def test_an_amount_outside_the_bounds_is_refused_naming_them_in_the_currency(
    currency, exponent, sample, smallest, largest
):
    for amount in (0, -1, 10**12 + 1):
        with pytest.raises(InvalidInput) as refused:
            money.refuse_out_of_bounds(amount, currency)
        assert (refused.value.code, refused.value.param) == ("parameter_out_of_range", "amount")
        assert refused.value.message == (
            f"amount must be between {smallest} and {largest} "
            f"(1 to 1000000000000 in minor units; {currency.upper()} has {exponent} decimals)."
        )
    for amount in (1, 10**12):
        money.refuse_out_of_bounds(amount, currency)  # no exception


@pytest.mark.parametrize(
    ("minor", "currency", "locale", "shown"),
    [
        (2500, "eur", "de", f"25,00{NBSP}€"),  # a sign after the number keeps the locale's space
        (1250, "bhd", "fr", f"1,250{NBSP}BHD"),
        (1250, "usd", "en_GB", "US$12.50"),  # a sign ending in a symbol gets no space
        (-1250, "bhd", "en", f"-BHD{NBSP}1.250"),
        (0, "jpy", "en", "¥0"),
        (7, "kwd", "en", f"KWD{NBSP}0.007"),
        (123456789, "usd", "en", "$1,234,567.89"),  # exact: no float on the way
    ],
)
def test_format_amount_reads_in_the_locale_with_cldr_currency_spacing(minor, currency, locale, shown):
    assert money.format_amount(minor, currency, locale=locale) == shown


def test_only_the_configured_lower_case_currencies_are_accepted(settings):
    settings.VPAY_CURRENCIES = ["usd", "jpy"]
    assert money.accepted_currencies() == ["usd", "jpy"]
    assert [money.is_accepted(c) for c in ("usd", "jpy", "USD", "eur", "bhd")] == [True, True, False, False, False]


@pytest.mark.parametrize(
    ("codes", "problems"),
    [
        (["usd", "jpy", "bhd", "xof"], []),
        (["USD"], ["VPAY_CURRENCIES: 'USD' must be lower case (payments send it so)."]),
        (["uds"], ["VPAY_CURRENCIES: 'uds' is not an ISO 4217 currency code."]),
        (["usd", ""], ["VPAY_CURRENCIES: '' is not an ISO 4217 currency code."]),
    ],
)
def test_the_startup_check_refuses_a_currency_that_is_not_a_lower_case_iso_code(settings, codes, problems):
    assert money.currency_problems(codes) == problems
    settings.VPAY_CURRENCIES = codes
    assert [p for p in charge_config_problems() if p.startswith("VPAY_CURRENCIES")] == problems


def test_the_default_currencies_pass_the_startup_check():
    from django.conf import settings

    assert money.currency_problems(settings.VPAY_CURRENCIES) == []
