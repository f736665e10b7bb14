from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # Built CONCURRENTLY: events may be large, and a plain CREATE INDEX would block every
    # emit for the whole build.
    atomic = False

    dependencies = [
        ('webhooks', '0010_endpoint_deliveries_list_index'),
    ]

    operations = [
        AddIndexConcurrently(
            model_name='event',
            index=models.Index(
                condition=models.Q(
                    ('fan_out', 'pending'),
                    models.Q(('fan_out_failures__gt', 0), ('fan_out_transient_failures__gt', 0), _connector='OR'),
                ),
                fields=['created_at'],
                name='events_pending_failed_before',
            ),
        ),
    ]
