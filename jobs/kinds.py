"""The closed set of job kinds.

A kind is declared here, registered with a handler (``jobs.registry``), and listed in the
``jobs`` table's CHECK constraint (generated from this enum by the model). A test keeps the
three the same list. Adding a kind is therefore a migration, on purpose: a worker must
never claim a row it has no handler for.
"""

from django.db import models


class JobKind(models.TextChoices):
    """Every kind of job the queue accepts."""

    TASK = "task", "Application task (Django Tasks API)"
    """A ``@task`` function from any importable module, run through the fence."""

    SWEEP_EXPIRED = "sweep_expired", "Hourly housekeeping sweep"
    """Singleton: expired fence rows and stale leases."""

    SWEEP_IDLE_CUSTOMERS = "sweep_idle_customers", "Hourly erasure of idle customers"
    """Singleton (``customers``): customers unused for 365 days with no live intent."""

    WEBHOOK_FAN_OUT = "webhook_fan_out", "Webhook outbox drain"
    """Singleton: pending events become one delivery (and deliver job) per subscribed endpoint."""

    WEBHOOK_DELIVER = "webhook_deliver", "Deliver one webhook attempt"
    """One attempt of one delivery (unfenced: calls the merchant's endpoint; writes are CAS)."""

    WEBHOOK_SCAN = "webhook_scan_deliveries", "Webhook delivery backstop"
    """Singleton: recovers expired attempt leases, re-enqueues due deliveries that lost their job."""

    SEND_ALERT = "send_alert", "Send one alert (log line and webhook)"
    """One row of ``alerts`` (``jobs.operator.alerts``): its ``alert=true`` log line and its POST to
    ``ALERT_WEBHOOK_URL``, each at most once."""

    POLL_CHARGE = "poll_charge", "Poll a charge's rail until it settles"
    """One live row per charge (dedupe key ``charge:poll:<id>``): charges/services/polling.py."""

    RESUBMIT_CHARGE = "resubmit_charge", "Resubmit a charge its rail never received"
    """Same reference, so the rail's idempotency makes a second submit harmless."""

    VOID_CHARGE = "void_charge", "Void at its rail a charge vpay failed on its own"
    """Dedupe key ``charge:void:<id>``: a dead redirect order or a refused submit, so a payer can
    never pay it later; a success the rail reports instead is recorded (charges/services/void_failed.py)."""

    POLL_REFUND = "poll_refund", "Send a refund to its rail and poll it until it settles"
    """One live row per refund (dedupe key ``refund:poll:<id>``): charges/services/refund_polling.py."""

    SCAN_LIVE_CHARGES = "scan_live_charges", "Backstop: re-enqueue polls of live charges"
    """Singleton, every 10 minutes: a live charge whose poll job was lost gets a new one."""

    BULK_EXPAND = "bulk_expand", "Expand one bulk operation into its per-item units"
    """One per bulk operation (``jobs.primitives.expansion``): pages through the operation's filter and
    creates one ``bulk_item`` unit per match under a deterministic name."""

    BULK_ITEM = "bulk_item", "One item of a bulk operation"
    """Fenced: the single-item service (replay one dead letter, resend one delivery) and the
    item's outcome on the operation commit together."""
