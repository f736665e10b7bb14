"""The events outbox, webhook endpoints and their sealed secrets, deliveries and their attempts."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.functions import RandomUUID
from django.contrib.postgres.indexes import BrinIndex
from django.db import DatabaseError, models
from django.db.models import Q
from django.db.models.functions import Cast, Concat, Length, Now, Replace

from vpay.ids import ID_MAX_LENGTH, new_id
from webhooks.event_types import EventType


def new_event_id() -> str:
    return new_id("evt")


# The lookup the attempt table's CHECK constraints are written with.
models.TextField.register_lookup(Length, "length")


class FanOut(models.TextChoices):
    PENDING = "pending"
    FANNED_OUT = "fanned_out"
    ABANDONED = "abandoned"


class Event(models.Model):
    """One thing that happened to a merchant's object, written in the same transaction as
    the change (``webhooks.events.emit``). ``data`` is the rendered wire object: the webhook
    body and ``GET /v1/events/{id}`` both serve it, so the two can never disagree."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_event_id, editable=False)
    merchant = models.ForeignKey("merchants.Merchant", on_delete=models.PROTECT, related_name="events")
    type = models.CharField(max_length=100, choices=EventType.choices)
    data = models.JSONField()
    # The API version ``data`` was rendered in (vpay.api_version); null for an event written
    # before events carried one, which renders without it (its signed body never changes).
    api_version = models.CharField(max_length=10, null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    fan_out = models.CharField(max_length=16, choices=FanOut.choices, db_default=FanOut.PENDING)
    fan_out_failures = models.SmallIntegerField(db_default=0)
    # Passes that failed transiently (never abandons; alerts once at a bound: webhooks.decisions).
    fan_out_transient_failures = models.IntegerField(db_default=0)
    # How often an operator re-drove it out of ``abandoned`` (each abandonment alerts once).
    fan_out_redrives = models.IntegerField(db_default=0)

    class Meta:
        db_table = "events"
        permissions = [("redrive_event", "Can re-drive abandoned events (fan them out again)")]
        constraints = [
            models.CheckConstraint(condition=Q(type__in=EventType.values), name="events_type_known"),
            models.CheckConstraint(condition=Q(fan_out__in=FanOut.values), name="events_fan_out_known"),
        ]
        indexes = [
            models.Index(fields=["merchant", "-created_at", "-id"], name="events_merchant_recent"),
            models.Index(fields=["created_at"], name="events_pending_fan_out", condition=Q(fan_out=FanOut.PENDING)),
            # The pending events whose fan-out has failed before: taken one per transaction,
            # never in a page (webhooks.services.fanout), found without reading a backlog.
            models.Index(
                fields=["created_at"],
                name="events_pending_failed_before",
                condition=Q(fan_out=FanOut.PENDING) & (Q(fan_out_failures__gt=0) | Q(fan_out_transient_failures__gt=0)),
            ),
            # The abandoned-events gauge (webhooks.gauge_sql): only what an operator must re-drive.
            models.Index(fields=["created_at"], name="events_abandoned", condition=Q(fan_out=FanOut.ABANDONED)),
            # Retention's keyset pages (webhooks.retention): fanned-out events, oldest first.
            models.Index(
                fields=["created_at", "id"], name="events_fanned_out_created", condition=Q(fan_out=FanOut.FANNED_OUT)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"

    def __repr__(self) -> str:
        return f"<Event {self.id} {self.type} merchant={self.merchant_id}>"


def new_endpoint_id() -> str:
    return new_id("we")


class WebhookEndpoint(models.Model):
    """Where a merchant wants events delivered, which types, and (in ``secrets``) how they are signed.

    Deleting an endpoint through the API sets ``deleted_at``: its deliveries and attempts
    are evidence and stay; the fan-out stops creating deliveries for it.
    """

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_endpoint_id, editable=False)
    merchant = models.ForeignKey("merchants.Merchant", on_delete=models.PROTECT, related_name="webhook_endpoints")
    url = models.CharField(max_length=2048)
    # Event types, or ["*"] for every type. The fan-out's @> test reads this column.
    enabled_events = ArrayField(models.CharField(max_length=100))
    description = models.CharField(max_length=500, blank=True, db_default="")
    created_at = models.DateTimeField(db_default=Now())
    deleted_at = models.DateTimeField(null=True, blank=True)
    # Disabled (by the health sweep, the merchant or an operator): nothing is sent and no new
    # delivery is made for it; its pending deliveries wait and resume when it is enabled.
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=300, blank=True, db_default="")
    disabled_by = models.CharField(max_length=150, blank=True, db_default="")
    # Attempts before this instant do not count towards its health (creation, re-enabling).
    health_since = models.DateTimeField(db_default=Now())
    # When the current failing streak was warned about (webhooks.services.endpoint_health).
    health_warned_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "webhook_endpoints"
        permissions = [("disable_webhookendpoint", "Can disable and re-enable webhook endpoints")]
        constraints = [
            models.CheckConstraint(
                condition=Q(enabled_events__len__gt=0), name="webhook_endpoints_enabled_events_not_empty"
            ),
            # A disabled endpoint says why and who, so the merchant and the operator can act.
            models.CheckConstraint(
                condition=Q(disabled_at__isnull=True) | (~Q(disabled_reason="") & ~Q(disabled_by="")),
                name="webhook_endpoints_disabled_says_why",
            ),
        ]
        indexes = [
            # The fan-out's lookup: a merchant's live endpoints.
            models.Index(fields=["merchant"], name="webhook_endpoints_live", condition=Q(deleted_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        # Never a secret: a count answers "is this endpoint mid-rotation?" without one. The
        # count is a query, so a repr taken inside a broken transaction says "?" instead.
        try:
            count = str(self.secrets.count()) if not self._state.adding else "0"
        except DatabaseError:
            count = "?"
        # The origin only: merchants put tokens in paths and query strings.
        origin = "{0.scheme}://{0.netloc}".format(urlsplit(self.url))
        return f"<WebhookEndpoint {self.id} url={origin!r} secrets=<{count} redacted>>"


class WebhookSecret(models.Model):
    """One signing secret of an endpoint, sealed for that endpoint (``webhooks/sealing.py``).

    ``expires_at`` NULL: current. Rotation sets it to ``now() + overlap`` in SQL; until then
    the old secret keeps signing alongside the new one (one ``v1`` each).
    """

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="secrets")
    sealed = models.TextField()
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "webhook_secrets"
        indexes = [models.Index(fields=["endpoint", "created_at"], name="webhook_secrets_endpoint")]

    def __str__(self) -> str:
        return f"secret {self.pk} of {self.endpoint_id} (redacted)"

    def __repr__(self) -> str:
        return f"<WebhookSecret {self.pk} endpoint={self.endpoint_id} (redacted)>"


class DeliveryState(models.TextChoices):
    PENDING = "pending"
    """Waiting for its next attempt (``next_attempt_at``)."""
    DELIVERING = "delivering"
    """An attempt holds a lease and may be talking to the receiver right now."""
    SUCCEEDED = "succeeded"
    """The receiver answered 2xx."""
    EXHAUSTED = "exhausted"
    """The ladder ran out; alerted once. A human tells the merchant."""
    REFUSED = "refused"
    """The SSRF guard refused the address: permanent, recorded."""
    CANCELLED = "cancelled"
    """Its endpoint was deleted before it was delivered (the merchant chose this), or an
    operator cancelled its deliver job: ended without alerting, ``cancel_reason`` says why.
    Not resendable: there is nowhere to send, or someone entitled to said stop."""


FINISHED_STATES = [
    DeliveryState.SUCCEEDED,
    DeliveryState.EXHAUSTED,
    DeliveryState.REFUSED,
    DeliveryState.CANCELLED,
]


# A delivery's wire id: ``whd_`` and the 32 hex digits of a random UUID (122 random bits),
# made by the database so the fan-out's one-statement insert gets one per row. The primary
# key stays an internal bigint (job payloads, dedupe keys, the admin): a sequential wire id
# (``whd_1042``) told every merchant how many deliveries vpay makes.
DELIVERY_WIRE_PREFIX = "whd_"
RANDOM_DELIVERY_ID = Concat(
    models.Value(DELIVERY_WIRE_PREFIX),
    Replace(Cast(RandomUUID(), models.CharField()), models.Value("-"), models.Value("")),
    output_field=models.CharField(),
)


class WebhookDelivery(models.Model):
    """One event for one endpoint: at least once, however many attempts it takes."""

    public_id = models.CharField(max_length=ID_MAX_LENGTH, db_default=RANDOM_DELIVERY_ID, editable=False)
    event = models.ForeignKey(Event, on_delete=models.PROTECT, related_name="deliveries")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.PROTECT, related_name="deliveries")
    state = models.CharField(max_length=16, choices=DeliveryState.choices, db_default=DeliveryState.PENDING)
    attempts = models.IntegerField(db_default=0)
    # Attempts made before the current ladder began (an operator's resend starts a fresh
    # ladder while attempt numbers keep counting): the rung is attempts - ladder_base.
    ladder_base = models.IntegerField(db_default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The digest of the first body that may have left (see delivery.Attempted); every later
    # attempt must render the same bytes.
    payload_sha256 = models.CharField(max_length=64, null=True, blank=True)
    last_status_code = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True, blank=True)
    # Why a delivery was ``cancelled`` (empty otherwise).
    cancel_reason = models.CharField(max_length=300, blank=True, db_default="")

    class Meta:
        db_table = "webhook_deliveries"
        verbose_name = "webhook delivery"
        verbose_name_plural = "webhook deliveries"
        permissions = [("resend_webhookdelivery", "Can resend webhook deliveries")]
        constraints = [
            models.CheckConstraint(
                condition=Q(ladder_base__gte=0, ladder_base__lte=models.F("attempts")),
                name="webhook_deliveries_ladder_base_in_range",
            ),
            models.UniqueConstraint(fields=["event", "endpoint"], name="webhook_deliveries_event_endpoint"),
            # The API's lookups by wire id (a retry's path, a list's cursor).
            models.UniqueConstraint(fields=["public_id"], name="webhook_deliveries_public_id"),
            models.CheckConstraint(condition=Q(state__in=DeliveryState.values), name="webhook_deliveries_state_known"),
            # A lease exists exactly while an attempt is delivering.
            models.CheckConstraint(
                condition=(
                    Q(state=DeliveryState.DELIVERING, lease_token__isnull=False, lease_expires_at__isnull=False)
                    | (~Q(state=DeliveryState.DELIVERING) & Q(lease_token__isnull=True, lease_expires_at__isnull=True))
                ),
                name="webhook_deliveries_lease_iff_delivering",
            ),
        ]
        indexes = [
            # The backstop's "due and pending" read.
            models.Index(
                fields=["next_attempt_at"], name="webhook_deliveries_due", condition=Q(state=DeliveryState.PENDING)
            ),
            # A freed slot's hand-off: the endpoint's longest-waiting due delivery.
            models.Index(
                fields=["endpoint", "next_attempt_at"],
                name="webhook_deliveries_ep_due",
                condition=Q(state=DeliveryState.PENDING),
            ),
            # The per-endpoint in-flight count and the expired-lease scan.
            models.Index(
                fields=["endpoint", "lease_expires_at"],
                name="webhook_deliveries_in_flight",
                condition=Q(state=DeliveryState.DELIVERING),
            ),
            # The failed-deliveries gauge (webhooks.gauge_sql) and `webhooks resend --since`:
            # deliveries that ended for good without being delivered, by when.
            models.Index(
                fields=["completed_at"],
                name="webhook_deliveries_failed",
                condition=Q(state__in=[DeliveryState.EXHAUSTED, DeliveryState.REFUSED]),
            ),
            # The merchant's list of an endpoint's deliveries (GET /v1/webhook_endpoints/{id}/deliveries),
            # newest first, and its cursors in both directions.
            models.Index(fields=["endpoint", "-created_at", "-id"], name="webhook_deliveries_ep_created"),
            # Endpoint health: an endpoint's deliveries touched recently (every attempt moves updated_at).
            models.Index(fields=["endpoint", "updated_at"], name="webhook_deliveries_ep_recent"),
            # Retention's keyset pages (webhooks.retention): finished deliveries by when they finished.
            models.Index(
                fields=["completed_at", "id"],
                name="webhook_deliveries_finished",
                condition=Q(state__in=FINISHED_STATES),
            ),
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} of {self.event_id} to {self.endpoint_id}"

    def __repr__(self) -> str:
        return f"<WebhookDelivery {self.pk} {self.event_id}->{self.endpoint_id} {self.state}>"


class AttemptState(models.TextChoices):
    IN_FLIGHT = "in_flight"
    """Written before sending; holds the lease."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """Heard a refusal (non-2xx, 3xx included), or refused to send (no secret, SSRF)."""
    NO_RESPONSE = "no_response"
    """Nothing came back (``status_code`` NULL): timeout, reset, refused connection."""
    ABANDONED = "abandoned"
    """The lease expired with no answer recorded (the worker died); recovered."""
    STALE = "stale"
    """A late finisher whose lease had expired: its answer was discarded."""


class DeliveryAttempt(models.Model):
    """One HTTP try (append-only evidence), written before the request goes out."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.IntegerField()
    lease_token = models.UUIDField()
    state = models.CharField(max_length=16, choices=AttemptState.choices, db_default=AttemptState.IN_FLIGHT)
    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    status_code = models.IntegerField(null=True, blank=True, help_text="NULL: no answer was heard.")
    duration_ms = models.IntegerField(null=True, blank=True)
    response_excerpt = models.TextField(db_default="", blank=True)
    error = models.TextField(db_default="", blank=True)

    class Meta:
        db_table = "webhook_delivery_attempts"
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="webhook_attempts_delivery_number"),
            models.CheckConstraint(condition=Q(state__in=AttemptState.values), name="webhook_attempts_state_known"),
            models.CheckConstraint(
                condition=Q(response_excerpt__length__lte=4096), name="webhook_attempts_excerpt_bounded"
            ),
            models.CheckConstraint(condition=Q(error__length__lte=2000), name="webhook_attempts_error_bounded"),
        ]
        indexes = [
            # The admin overview's "last hour" reads (vpay/overview/sql.py). BRIN: attempts are
            # appended in started_at order, so a block range index is a few pages and costs
            # the hot insert path next to nothing.
            BrinIndex(fields=["started_at"], name="webhook_attempts_started_brin"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}"

    def __repr__(self) -> str:
        return f"<DeliveryAttempt {self.pk} delivery={self.delivery_id} #{self.number} {self.state} {self.status_code}>"
