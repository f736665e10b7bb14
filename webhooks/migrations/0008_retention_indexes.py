from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built CONCURRENTLY: events and deliveries may be large by the time retention arrives,
    # and a plain CREATE INDEX would block the outbox and every delivery for the whole build.
    atomic = False

    dependencies = [
        ('webhooks', '0007_endpoint_health_and_retention'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='event',
            index=models.Index(condition=models.Q(('fan_out', 'fanned_out')), fields=['created_at', 'id'], name='events_fanned_out_created'),
        ),
        AddIndexConcurrently(
            model_name='webhookdelivery',
            index=models.Index(fields=['endpoint', 'updated_at'], name='webhook_deliveries_ep_recent'),
        ),
        AddIndexConcurrently(
            model_name='webhookdelivery',
            index=models.Index(condition=models.Q(('state__in', ['succeeded', 'exhausted', 'refused', 'cancelled'])), fields=['completed_at', 'id'], name='webhook_deliveries_finished'),
        ),
    ]
