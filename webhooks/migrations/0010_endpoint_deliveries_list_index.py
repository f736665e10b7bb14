from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built CONCURRENTLY: webhook_deliveries may be large, and a plain CREATE INDEX would
    # block every delivery for the whole build.
    atomic = False

    dependencies = [
        ('webhooks', '0009_webhook_endpoint_test_event_type'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='webhookdelivery',
            index=models.Index(fields=['endpoint', '-created_at', '-id'], name='webhook_deliveries_ep_created'),
        ),
    ]
