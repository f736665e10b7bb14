"""Seal the payer's credentials at rest: a checkout session's client secret, a charge's
pay_token and redirect URL (vpay.sealing.SealedTextField). Rows written before this
migration hold them in the clear; they are sealed here, in place."""

from django.db import migrations

import vpay.sealing

# (table, column): the columns this migration seals.
_COLUMNS = [("charges", "pay_token"), ("charges", "redirect_url"), ("checkout_sessions", "client_secret")]


def _rewrite(schema_editor, transform, *, sealed: bool) -> None:
    # A Fernet token starts with its version byte, base64 "gAAAAA": what is not one yet is
    # plaintext from before this migration (or, backwards, a token to open).
    test = "LIKE" if sealed else "NOT LIKE"
    with schema_editor.connection.cursor() as cursor:
        for table, column in _COLUMNS:
            cursor.execute(f"SELECT id, {column} FROM {table} WHERE {column} IS NOT NULL AND {column} {test} 'gAAAAA%%'")
            rows = cursor.fetchall()
            for row_id, value in rows:
                cursor.execute(f"UPDATE {table} SET {column} = %s WHERE id = %s", [transform(value), row_id])


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
