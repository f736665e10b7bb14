"""What Django's error reports (the ``VPAY_DEBUG`` technical 500 page) may show.

Django's own filter hides settings and META entries by name (``KEY``, ``SECRET``,
``PASS`` …), which misses ``DATABASE_URL`` and ``ALERT_WEBHOOK_URL``, and it shows every
string value as it is, so a URL with a password under an innocent name, or a local
variable holding a DSN, reaches the page. This filter adds vpay's secret names and runs
every string it shows through the log redaction (:func:`vpay.logging.redact`: the known
secrets by value, credential shapes by pattern), traceback variables included.
"""

from __future__ import annotations

import re

from django.views.debug import SafeExceptionReporterFilter

from vpay.logging import redact


class SecretsExceptionReporterFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|COOKIE|CREDENTIAL|DSN|DATABASE_URL|DATABASE_DIRECT_URL|WEBHOOK_URL",
        flags=re.IGNORECASE,
    )

    def cleanse_setting(self, key, value):
        cleansed = super().cleanse_setting(key, value)
        # str(): a lazy string (django-axes' AXES_USERNAME_FORM_FIELD) passes isinstance but
        # not the regular expressions redact() runs.
        return redact(str(cleansed)) if isinstance(cleansed, str) else cleansed

    def get_traceback_frame_variables(self, request, tb_frame):
        # Django cleanses frame variables only under @sensitive_variables, and only when
        # DEBUG is off; here a variable is hidden by its name and redacted by its value
        # always. Other objects are left as they are (their reprs hide their secrets).
        return [
            (name, self.cleanse_setting(name, value) if isinstance(value, str | dict | list | tuple) else value)
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]
