"""The operator console's sign-in: Django Admin with a second factor (TOTP, django-otp) for
staff in live mode, behind django-axes' failed-login lockout (``docs/ops-console.md``)."""
