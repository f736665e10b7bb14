"""A random wire id for every webhook delivery (``whd_`` + 32 hex digits), replacing the
sequential ``whd_<primary key>`` in the API.

webhook_deliveries may be large and is written by every attempt, so nothing here holds a
lock that blocks deliveries for longer than a catalogue change:

1. the column is added nullable, without a default (no rewrite), then given its default
   (new rows only: also no rewrite);
2. existing rows get their ids in keyset batches of ids, one short transaction each;
3. the unique index is built CONCURRENTLY and then attached as the constraint;
4. NOT NULL is proved by a CHECK added NOT VALID and validated (which blocks no writes),
   so SET NOT NULL does not scan the table under its exclusive lock; the CHECK then goes.
"""

import django.contrib.postgres.functions
import django.db.models.functions.comparison
import django.db.models.functions.text
from django.db import migrations, models

BATCH = 10_000
RANDOM_ID = "'whd_' || replace(gen_random_uuid()::text, '-', '')"


def backfill(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT min(id), max(id) FROM webhook_deliveries WHERE public_id IS NULL")
        low, high = cursor.fetchone()
        if low is None:
            return
        # One batch per statement (the migration is not atomic: each commits on its own),
        # walking the primary key, so no batch scans what an earlier one filled in.
        for start in range(low, high + 1, BATCH):
            cursor.execute(
                f"UPDATE webhook_deliveries SET public_id = {RANDOM_ID}"
                " WHERE id >= %s AND id < %s AND public_id IS NULL",
                [start, start + BATCH],
            )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('webhooks', '0011_events_pending_failed_before'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "ALTER TABLE webhook_deliveries ADD COLUMN public_id varchar(40) NULL",
                    reverse_sql="ALTER TABLE webhook_deliveries DROP COLUMN public_id",
                ),
                migrations.RunSQL(
                    f"ALTER TABLE webhook_deliveries ALTER COLUMN public_id SET DEFAULT ({RANDOM_ID})",
                    reverse_sql=migrations.RunSQL.noop,
                ),
                migrations.RunPython(backfill, migrations.RunPython.noop),
                migrations.RunSQL(
                    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_public_id"
                    " ON webhook_deliveries (public_id)",
                    reverse_sql=migrations.RunSQL.noop,
                ),
                migrations.RunSQL(
                    "ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_public_id"
                    " UNIQUE USING INDEX webhook_deliveries_public_id",
                    reverse_sql=migrations.RunSQL.noop,
                ),
                migrations.RunSQL(
                    "ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_public_id_present"
                    " CHECK (public_id IS NOT NULL) NOT VALID",
                    reverse_sql=migrations.RunSQL.noop,
                ),
                migrations.RunSQL(
                    "ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_public_id_present",
                    reverse_sql=migrations.RunSQL.noop,
                ),
                migrations.RunSQL(
                    "ALTER TABLE webhook_deliveries ALTER COLUMN public_id SET NOT NULL",
                    reverse_sql=migrations.RunSQL.noop,
                ),
                migrations.RunSQL(
                    "ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_public_id_present",
                    reverse_sql=migrations.RunSQL.noop,
                ),
            ],
            state_operations=[
                migrations.AddField(
                    model_name='webhookdelivery',
                    name='public_id',
                    field=models.CharField(
                        db_default=django.db.models.functions.text.Concat(
                            models.Value('whd_'),
                            django.db.models.functions.text.Replace(
                                django.db.models.functions.comparison.Cast(
                                    django.contrib.postgres.functions.RandomUUID(), models.CharField()
                                ),
                                models.Value('-'),
                                models.Value(''),
                            ),
                            output_field=models.CharField(),
                        ),
                        editable=False,
                        max_length=40,
                    ),
                ),
                migrations.AddConstraint(
                    model_name='webhookdelivery',
                    constraint=models.UniqueConstraint(fields=('public_id',), name='webhook_deliveries_public_id'),
                ),
            ],
        ),
    ]
