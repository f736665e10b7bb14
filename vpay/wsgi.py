import os

from django.core.wsgi import get_wsgi_application

from vpay.embedded_db import ensure_running_if_used
from vpay.startup_heap import startup_heap

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vpay.settings")
# Reads the settings (a refused configuration raises here, before a worker serves) and, in
# development without DATABASE_URL, starts the embedded database.
ensure_running_if_used()
with startup_heap():  # the collector paused while Django sets up (vpay/startup_heap.py)
    application = get_wsgi_application()
