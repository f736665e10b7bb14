"""``admin.site``: Django Admin that, in live mode, admits only staff verified by a TOTP
device (django-otp). Its actions move money, so a stolen password alone must not open it.

Decided per request (``settings.LIVE_MODE``, or ``VPAY_ADMIN_OTP`` to ask for it in
development too), so the development path (``make run``'s admin/admin) signs in with a
password alone. Failed passwords are throttled by django-axes before this site sees them
(``AUTHENTICATION_BACKENDS``); wrong tokens by django-otp's own per-device throttle.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.admin import AdminSite
from django_otp.admin import OTPAdminAuthenticationForm, OTPAdminSite


def otp_required() -> bool:
    """Whether staff need a verified second factor to use the console."""
    return bool(settings.LIVE_MODE or settings.VPAY_ADMIN_OTP)


class ConsoleSite(AdminSite):
    @property
    def login_form(self):
        # The login page asks for the token too (OTP device and token fields).
        return OTPAdminAuthenticationForm if otp_required() else None

    @property
    def login_template(self):
        return OTPAdminSite.login_template if otp_required() else None

    def has_permission(self, request) -> bool:
        # An unverified staff user is treated as not staff: the login page, asking for a token.
        if not super().has_permission(request):
            return False
        return not otp_required() or request.user.is_verified()
