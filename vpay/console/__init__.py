"""Operator tooling outside any payments app: the console's sign-in (Django Admin with a
second factor, TOTP via django-otp, for staff in live mode, behind django-axes' failed-login
lockout; ``docs/ops-console.md``) and the commands ``totp`` and ``reseal``
(``docs/settings.md``, "Sealed values")."""
