"""Amounts in each currency's minor units: which currencies vpay accepts, each one's
exponent, the amounts it may carry, and how an amount reads (admin, error messages, the
hosted checkout page).

An amount is always an integer of minor units (cents, yen, fils), as the API, the
database and the rails carry it; nothing here converts money, it only reads the integer
in its currency. The currency data is Babel's (CLDR), never a table of ours.
"""

from __future__ import annotations

import unicodedata
from decimal import Decimal

from babel.numbers import format_currency, get_currency_precision, get_currency_symbol, is_currency
from django.conf import settings

from vpay.errors import InvalidInput

# The same bounds in minor units for every currency. vpay holds no exchange rates, so an
# economic floor (a card network's ~0.50 USD) cannot be derived per currency: that is
# the rail's to refuse. The floor is the smallest amount a currency carries, one minor
# unit; the ceiling is a representation bound: far inside bigint, exact as a double in
# any client's JSON, and above any single real payment in the currencies vpay serves.
# What the exponent changes is how they read: $0.01 to $10,000,000,000.00,
# ¥1 to ¥1,000,000,000,000, BHD 0.001 to BHD 1,000,000,000.000.
MIN_MINOR = 1
MAX_MINOR = 10**12

# CLDR's currencySpacing, which Babel does not apply: a currency sign that ends (or
# starts) with a letter gets a no-break space before the digits, so it reads
# "BHD 1.250", not "BHD1.250" ("$25.00" and "€25.00" stay as they are).
_NBSP = "\u00a0"


def accepted_currencies() -> list[str]:
    """The codes a payment may use: ``VPAY_CURRENCIES`` (lower case), not every ISO
    code Babel knows: a currency is accepted because the deployment's rails settle it.
    ``currency_problems`` holds each one to being a code Babel knows."""
    return list(settings.VPAY_CURRENCIES)


def is_accepted(currency: str) -> bool:
    return currency in settings.VPAY_CURRENCIES  # lower case, as currency_problems holds it


def exponent(currency: str) -> int:
    """Decimal places of the currency's minor unit: 2 for usd, 0 for jpy and xof, 3 for bhd.
    Babel's (CLDR's ``digits``), which is ISO 4217's for every currency in the default
    set; CLDR differs from ISO for a few (iqd 0 against 3, for one)."""
    return get_currency_precision(currency.upper())


def amount_bounds(currency: str) -> tuple[int, int]:
    """The smallest and largest amount, in minor units, a payment in ``currency`` may be."""
    return MIN_MINOR, MAX_MINOR


def within_bounds(amount: int, currency: str) -> bool:
    low, high = amount_bounds(currency)
    return low <= amount <= high


def format_amount(minor: int, currency: str, locale: str = "en") -> str:
    """``minor`` units of ``currency`` as a person reads them in ``locale``:
    ``€25.00``, ``¥2,500``, ``BHD 1.250`` (that space is a no-break space)."""
    code = currency.upper()
    text = format_currency(Decimal(minor).scaleb(-exponent(code)), code, locale=locale)
    return _spaced(text, get_currency_symbol(code, locale=locale))


def _spaced(text: str, symbol: str) -> str:
    at = text.find(symbol)
    if not symbol or at < 0:
        return text
    end = at + len(symbol)
    if end < len(text) and _digit(text[end]) and not _sign(symbol[-1]):
        return text[:end] + _NBSP + text[end:]
    if at > 0 and _digit(text[at - 1]) and not _sign(symbol[0]):
        return text[:at] + _NBSP + text[at:]
    return text


def _digit(char: str) -> bool:
    return unicodedata.category(char) == "Nd"


def _sign(char: str) -> bool:
    """A symbol (``$``, ``€``) or a space: CLDR puts no space after either."""
    return unicodedata.category(char)[0] in "SZ"


def bounds_text(currency: str) -> str:
    """The bounds as an error message names them, in the currency and in minor units."""
    low, high = amount_bounds(currency)
    code = currency.upper()
    return (
        f"between {format_amount(low, currency)} and {format_amount(high, currency)} "
        f"({low} to {high} in minor units; {code} has {exponent(code)} decimals)"
    )


def refuse_out_of_bounds(amount: int, currency: str, *, param: str = "amount") -> None:
    """Raise ``InvalidInput`` (``parameter_out_of_range``) unless ``amount`` is within
    ``currency``'s bounds."""
    if not within_bounds(amount, currency):
        raise InvalidInput("parameter_out_of_range", f"{param} must be {bounds_text(currency)}.", param=param)


def currency_problems(codes: list[str]) -> list[str]:
    """What is wrong with a ``VPAY_CURRENCIES`` list, for the startup check."""
    problems = []
    for code in codes:
        if code != code.lower():
            problems.append(f"VPAY_CURRENCIES: {code!r} must be lower case (payments send it so).")
        elif not is_currency(code.upper()):
            problems.append(f"VPAY_CURRENCIES: {code!r} is not an ISO 4217 currency code.")
    return problems
