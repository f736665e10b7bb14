"""The hosted checkout page: what a payer sees at a checkout session's ``url``."""
