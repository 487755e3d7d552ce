#!/bin/sh
# The image's entry points (Dockerfile ENTRYPOINT; the Kubernetes manifests under
# deploy/kubernetes/ name them as the container's first argument):
#
#   web              uvicorn on :8000; on SIGTERM it stops accepting and lets open streams end,
#                    for at most AGENTOPS_WEB_DRAIN_S (default 4500 s: the 75-minute absolute
#                    bound of a call, AGENTOPS_INFERENCE_BOUNDS.absolute_ms)
#   worker           a Celery worker; SIGTERM is its warm shutdown (a call out is left to end)
#   beat             Celery beat: exactly one per deployment
#   migrate          manage.py migrate (the migrations Job)
#   wait-migrations  returns once no migration is left unapplied (the init container that keeps
#                    new code from running before its migrations)
#
# Anything else is run as a command (docker compose's `command:` lines, `manage.py ...`).
set -eu

role="${1:-web}"
[ "$#" -gt 0 ] && shift

case "$role" in
    web)
        exec uvicorn interfaces.asgi:application \
            --host 0.0.0.0 --port "${AGENTOPS_WEB_PORT:-8000}" \
            --proxy-headers --forwarded-allow-ips "${AGENTOPS_FORWARDED_ALLOW_IPS:-*}" \
            --timeout-keep-alive "${AGENTOPS_WEB_KEEPALIVE_S:-75}" \
            --timeout-graceful-shutdown "${AGENTOPS_WEB_DRAIN_S:-4500}" \
            "$@"
        ;;
    worker)
        exec celery -A agentops worker -l info "$@"
        ;;
    beat)
        exec celery -A agentops beat -l info -s "${AGENTOPS_BEAT_SCHEDULE:-/data/celerybeat-schedule}" "$@"
        ;;
    migrate)
        exec python manage.py migrate --noinput "$@"
        ;;
    wait-migrations)
        until python manage.py migrate --check >/dev/null 2>&1; do
            echo "agentops: waiting for the migrations (the migrate Job) to be applied"
            sleep "${AGENTOPS_WAIT_MIGRATIONS_S:-5}"
        done
        echo "agentops: no migration left unapplied"
        ;;
    *)
        exec "$role" "$@"
        ;;
esac
