"""Startup checks of the charge configuration (run by ``runworker``, ``runserver`` and
``manage.py check``): a rail the worker cannot use, a policy whose windows contradict
the rail timeout, or a currency that is not an ISO code in lower case refuses to start
with a message naming what is wrong."""

from __future__ import annotations

from django.conf import settings
from django.core import checks

from charges.money import currency_problems
from charges.rails.config import RailConfigError, load_rails


def charge_config_problems() -> list[str]:
    problems = []
    try:
        load_rails(
            rails_file=settings.VPAY_RAILS_FILE,
            sandbox_url=settings.VPAY_SANDBOX_RAIL_URL,
            live_mode=settings.LIVE_MODE,
        )
    except RailConfigError as exc:
        problems.append(str(exc))
    try:
        from charges.policy import from_settings

        policy = from_settings()
    except ValueError as exc:
        problems.append(f"VPAY_CHARGE_* settings: {exc}")
    else:
        # The crash-recovery guard assumes a confirm can be inside its rail call for at most
        # the rail timeout: a window shorter than that would let a worker recover (resubmit,
        # or fail as a dead order) a charge whose confirm is still waiting for its answer.
        # The adapter makes the premise true: the whole exchange is cut at the total
        # timeout (charges/rails/adapter.py, _DeadlineBackend over vpay.http_deadline), connect included, so
        # connect + total is a bound with room to spare.
        total = settings.VPAY_RAIL_TIMEOUT_SECONDS + settings.VPAY_RAIL_CONNECT_TIMEOUT_SECONDS
        if policy.not_found_window <= total:
            problems.append(
                f"VPAY_CHARGE_NOT_FOUND_WINDOW_SECONDS={policy.not_found_window:g} must exceed the rail "
                f"request timeouts ({total:g} s): younger charges may still be inside a live confirm"
            )
    problems.extend(currency_problems(settings.VPAY_CURRENCIES))
    days = settings.VPAY_RETENTION_PROVIDER_REQUESTS_DAYS
    if days * 86400.0 < settings.VPAY_CHARGE_HORIZON_SECONDS + 86400.0:
        problems.append(
            f"VPAY_RETENTION_PROVIDER_REQUESTS_DAYS={days} is shorter than the charge horizon plus a day:"
            " an operator reconciling a charge that just settled needs its rail requests"
        )
    return problems


@checks.register()
def check_charge_config(app_configs=None, **kwargs):
    return [checks.Error(p, id="charges.E001") for p in charge_config_problems()]
