# One image for every vpay process (web, worker, migrate); docker-compose.yml picks the command.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DJANGO_SETTINGS_MODULE=vpay.settings
WORKDIR /app
COPY requirements/ requirements/
# Production requirements only: the embedded development PostgreSQL (requirements/dev.txt)
# never ships, and live mode refuses to start without DATABASE_URL.
RUN pip install --no-cache-dir -r requirements/base.txt
COPY . .
RUN useradd --system --uid 1000 vpay && DATABASE_URL=postgresql://build@localhost/none python manage.py collectstatic --no-input
USER vpay
EXPOSE 8000 9100
CMD ["gunicorn", "vpay.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "2", "--access-logfile", "-"]
