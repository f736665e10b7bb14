from django.db import migrations

# An operator's cancel of a webhook_deliver job must stick: the delivery ends `cancelled`
# in the cancel's own transaction, so neither the backstop's re-enqueue of due `pending`
# deliveries nor its recovery of expired `delivering` leases sends it again. Every path
# that ends a job cancelled (waiting: at once; running: at its next reschedule; handed
# back: at the next beat; its worker dead: at once) inserts its dead letter with cause
# `cancelled`, so a trigger on that insert is the one place none of them can miss.
#
# A `delivering` delivery (a dead worker's attempt holds its lease) is cancelled too: its
# in-flight attempt becomes `abandoned`, and a late answer of that attempt is refused as
# stale by the record's lease check. A delivery already finished is left as it is. The
# merchant-facing reason is fixed text (webhooks.repository.CANCELLED_BY_OPERATOR, which
# tests/test_webhook_cancel.py holds it to); who and why stay on the dead letter. Rows by
# primary key; the attempts by webhook_attempts_delivery_number (delivery first). The WHEN
# keeps every other letter from calling the function.
OPERATOR_CANCEL_SQL = """
CREATE FUNCTION webhook_deliver_cancelled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    delivery bigint := (NEW.payload ->> 'delivery_id')::bigint;
BEGIN
    -- The delivery's row lock first, the order of every other writer (record, recover).
    PERFORM 1 FROM webhook_deliveries WHERE id = delivery FOR UPDATE;
    UPDATE webhook_delivery_attempts a
       SET state = 'abandoned', finished_at = now(),
           error = 'the delivery was cancelled by an operator while this attempt was in flight; no answer is recorded'
      FROM webhook_deliveries d
     WHERE a.delivery_id = delivery AND d.id = delivery AND d.state = 'delivering'
       AND a.lease_token = d.lease_token AND a.state = 'in_flight';
    UPDATE webhook_deliveries
       SET state = 'cancelled',
           cancel_reason = 'cancelled by an operator before it was delivered; nothing more is sent',
           completed_at = now(), updated_at = now(),
           lease_token = NULL, lease_expires_at = NULL
     WHERE id = delivery AND state IN ('pending', 'delivering');
    RETURN NULL;
END
$$;
CREATE TRIGGER dead_letters_webhook_deliver_cancelled AFTER INSERT ON dead_letters FOR EACH ROW
    WHEN (NEW.kind = 'webhook_deliver' AND NEW.cause = 'cancelled')
    EXECUTE FUNCTION webhook_deliver_cancelled();
"""

DROP_OPERATOR_CANCEL_SQL = """
DROP TRIGGER dead_letters_webhook_deliver_cancelled ON dead_letters;
DROP FUNCTION webhook_deliver_cancelled();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0009_retention_indexes"),
        ("webhooks", "0013_drop_host_only_breakers"),
    ]

    operations = [
        migrations.RunSQL(OPERATOR_CANCEL_SQL, DROP_OPERATOR_CANCEL_SQL),
    ]
