import os

from django.core.wsgi import get_wsgi_application

from vpay.embedded_db import ensure_running_if_used

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vpay.settings")
# Reads the settings (a refused configuration raises here, before a worker serves) and, in
# development without DATABASE_URL, starts the embedded database.
ensure_running_if_used()
application = get_wsgi_application()
