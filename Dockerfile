FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
RUN pip install --no-cache-dir -c constraints.txt ".[project,postgres]"
COPY . .
# collectstatic needs settings but no real secret or services.
RUN DJANGO_DEBUG=0 DJANGO_SECRET_KEY=collectstatic-only-not-a-real-secret-value-0123456789 \
    python manage.py collectstatic --noinput
RUN useradd --create-home app && mkdir -p /app/var/prometheus && chown -R app /app/var
USER app
EXPOSE 8000
CMD ["gunicorn", "project.wsgi"]
