"""Merchants and their credentials: secret API keys, OAuth clients and the bearer tokens
those clients obtain (keys and tokens stored as digests, never as themselves)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from vpay.ids import ID_MAX_LENGTH, new_id


def new_merchant_id() -> str:
    return new_id("acct")


def new_client_id() -> str:
    return new_id("cli")


class Merchant(models.Model):
    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_merchant_id, editable=False)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "merchants"
        permissions = [("roll_api_key", "Can roll merchants' secret keys")]
        constraints = [models.CheckConstraint(condition=~Q(name=""), name="merchants_name_not_blank")]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    def __repr__(self) -> str:
        return f"<Merchant {self.id}>"


class ApiKey(models.Model):
    """A secret key. Only its SHA-256 digest is stored: the key carries 256 random bits, so a
    fast digest is as good as a slow password hash here and costs nothing per request.
    ``last4`` lets an operator tell keys apart without seeing one."""

    merchant = models.ForeignKey(Merchant, on_delete=models.CASCADE, related_name="api_keys")
    digest = models.CharField(max_length=64, unique=True)
    last4 = models.CharField(max_length=4)
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="Set when the key was rolled: it stops working then (the overlap's end)."
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.TextField(blank=True, default="")

    class Meta:
        db_table = "merchant_api_keys"
        verbose_name = "secret key"
        permissions = [("revoke_api_key", "Can revoke secret keys")]
        constraints = [
            models.CheckConstraint(
                condition=Q(revoked_at__isnull=True) | ~Q(revoked_reason=""),
                name="merchant_api_keys_revoked_with_reason",
            )
        ]

    def __str__(self) -> str:
        return f"sk_…{self.last4}"

    def __repr__(self) -> str:
        return f"<ApiKey {self.pk} merchant={self.merchant_id} …{self.last4}>"


class OAuthClient(models.Model):
    """A merchant's OAuth client: it proves itself with a JWT signed by the private key that
    matches ``public_key`` (RFC 7523 ``private_key_jwt``); vpay never sees the private key."""

    id = models.CharField(primary_key=True, max_length=ID_MAX_LENGTH, default=new_client_id, editable=False)
    merchant = models.ForeignKey(Merchant, on_delete=models.CASCADE, related_name="oauth_clients")
    name = models.CharField(max_length=200)
    public_key = models.TextField(help_text="PEM (SubjectPublicKeyInfo): RSA of 2048 bits or more, EC P-256, Ed25519.")
    created_at = models.DateTimeField(db_default=Now())
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.TextField(blank=True, default="")

    class Meta:
        db_table = "oauth_clients"
        verbose_name = "OAuth client"
        permissions = [("revoke_oauth_client", "Can revoke OAuth clients")]
        constraints = [
            models.CheckConstraint(condition=~Q(name=""), name="oauth_clients_name_not_blank"),
            models.CheckConstraint(
                condition=Q(revoked_at__isnull=True) | ~Q(revoked_reason=""),
                name="oauth_clients_revoked_with_reason",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"

    def __repr__(self) -> str:
        return f"<OAuthClient {self.id} merchant={self.merchant_id}>"


class AccessToken(models.Model):
    """A bearer token issued to a client, by its SHA-256 digest. It dies at ``expires_at``
    (the database clock) or with its client; the hourly sweep deletes expired ones."""

    digest = models.CharField(max_length=64, unique=True)
    client = models.ForeignKey(OAuthClient, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "oauth_access_tokens"
        # The sweep's range scan (merchants.sweeps).
        indexes = [models.Index(fields=["expires_at"], name="oauth_access_tokens_expires")]

    def __str__(self) -> str:
        return f"access token {self.pk} of {self.client_id}"

    def __repr__(self) -> str:
        return f"<AccessToken {self.pk} client={self.client_id}>"


class AssertionJti(models.Model):
    """A client assertion's ``jti``, kept until the assertion expires: while it is here the
    same assertion (or another with its ``jti``) is refused as a replay."""

    client = models.ForeignKey(OAuthClient, on_delete=models.CASCADE, related_name="+")
    jti = models.CharField(max_length=255)
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "oauth_assertion_jtis"
        constraints = [models.UniqueConstraint(fields=["client", "jti"], name="oauth_assertion_jtis_client_jti")]
        # The sweep's range scan (merchants.sweeps).
        indexes = [models.Index(fields=["expires_at"], name="oauth_assertion_jtis_expires")]

    def __str__(self) -> str:
        return f"assertion jti {self.pk} of {self.client_id}"

    def __repr__(self) -> str:
        return f"<AssertionJti {self.pk} client={self.client_id}>"
