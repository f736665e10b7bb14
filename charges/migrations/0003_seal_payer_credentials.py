"""Seal the payer's credentials at rest: a checkout session's client secret, a charge's
pay_token and redirect URL (vpay.sealing.SealedTextField). Rows written before this
migration hold them in the clear; they are sealed here, in place."""

from django.db import migrations

import vpay.sealing

# (table, column): the columns this migration seals.
_COLUMNS = [("charges", "pay_token"), ("charges", "redirect_url"), ("checkout_sessions", "client_secret")]


def _rewrite(schema_editor, transform, *, sealed: bool) -> None:
    # A sealed value starts with "v2." (bound to its row) or, written before that format,
    # with Fernet's "gAAAAA": what is neither is plaintext from before this migration (or,
    # backwards, a token to open). Each is sealed for its own table, column and row.
    test = "(%s LIKE 'v2.%%' OR %s LIKE 'gAAAAA%%')"
    with schema_editor.connection.cursor() as cursor:
        for table, column in _COLUMNS:
            condition = test % (column, column) if sealed else f"NOT {test % (column, column)}"
            # Every row of the table once (a migration: no index to choose).
            cursor.execute(f"SELECT id, {column} FROM {table} WHERE {column} IS NOT NULL AND {condition}")
            rows = cursor.fetchall()
            for row_id, value in rows:
                binding = vpay.sealing.bound(table, column, row_id)
                # One row by its primary key.
                cursor.execute(f"UPDATE {table} SET {column} = %s WHERE id = %s", [transform(value, binding), row_id])


def seal_existing(apps, schema_editor):
    _rewrite(schema_editor, vpay.sealing.seal_text, sealed=False)


def open_existing(apps, schema_editor):
    _rewrite(schema_editor, vpay.sealing.open_text, sealed=True)


class Migration(migrations.Migration):
    dependencies = [
        ("charges", "0002_customer_fk_set_null"),
    ]

    operations = [
        migrations.AlterField(
            model_name="charge",
            name="pay_token",
            field=vpay.sealing.SealedTextField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="charge",
            name="redirect_url",
            field=vpay.sealing.SealedTextField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="checkoutsession",
            name="client_secret",
            field=vpay.sealing.SealedTextField(),
        ),
        migrations.RunPython(seal_existing, open_existing),
    ]
