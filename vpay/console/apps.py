"""The console's app (its ``totp`` and ``reseal`` commands) and Django Admin with :class:`ConsoleSite` as ``admin.site``."""

from __future__ import annotations

from django.apps import AppConfig
from django.contrib.admin import apps as admin_apps


class ConsoleConfig(AppConfig):
    default = True  # for "vpay.console"; the admin's config is named in INSTALLED_APPS
    name = "vpay.console"
    label = "console"
    verbose_name = "Operator console"


class ConsoleAdminConfig(admin_apps.AdminConfig):
    """``django.contrib.admin`` whose default site asks staff for a second factor in live mode."""

    default = False
    default_site = "vpay.console.site.ConsoleSite"
