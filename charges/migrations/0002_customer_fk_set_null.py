# The retention sweep deletes customers with SQL, not through the ORM, so the database
# itself must null a finished intent's customer: Django emulates SET_NULL in Python and
# creates the constraint with no ON DELETE action. A migration of its own because Django
# adds 0001's foreign keys only when that migration ends.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("charges", "0001_initial")]

    operations = [
        migrations.RunSQL(
            sql="""
DO $$
DECLARE fk text;
BEGIN
  SELECT c.conname INTO fk FROM pg_constraint c
    JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
   WHERE c.conrelid = 'payment_intents'::regclass AND c.contype = 'f' AND a.attname = 'customer_id';
  EXECUTE format('ALTER TABLE payment_intents DROP CONSTRAINT %I', fk);
  ALTER TABLE payment_intents ADD CONSTRAINT payment_intents_customer_set_null
    FOREIGN KEY (customer_id) REFERENCES customers (id) ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED;
END $$;
""",
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
