"""The queue's adapters behind ``jobs.port``: PostgreSQL (durable), in-process (not), and
the Django Tasks backend."""
