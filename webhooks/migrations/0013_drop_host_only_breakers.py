"""Drop the webhook breakers keyed on the host alone (``webhook_host:<host>``).

Breakers are now per merchant, host and port (``webhook_host:<merchant>:<host>:<port>``,
webhooks/services/host_breakers.py). A host-only row is read by nobody any more; left open
it would show as open on /metrics and keep its runbook's alert firing for ever. Deleting a
breaker row closes it, which is what a row that no longer guards anything should be.
A sequential scan of a small table (a row per vendor that ever failed).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ('jobs', '0004_breakers'),
        ('webhooks', '0012_webhookdelivery_public_id'),
    ]

    operations = [
        migrations.RunSQL(
            "DELETE FROM breakers WHERE starts_with(name, 'webhook_host:')"
            " AND name !~ '^webhook_host:acct_[A-Za-z0-9]+:.+:[0-9]+$'",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
