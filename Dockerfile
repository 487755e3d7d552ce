# syntax=docker/dockerfile:1
# The agentops image: one image, four entry points (web, worker, beat, migrate; see
# deploy/docker/entrypoint.sh), as docker-compose.yml and deploy/kubernetes/ run it.
#
#   docker build -t agentops:0.1.0 .
#
# Two stages: the first builds the dependencies into a virtualenv (compilers and pip's cache stay
# there); the second is the slim runtime with that virtualenv, the source and a non-root user.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/agentops
COPY pyproject.toml README.md ./
COPY agentops agentops
COPY inference inference
COPY calls calls
COPY waits waits
COPY breaker breaker
COPY turns turns
COPY interfaces interfaces
COPY devtools devtools
# The project's dependencies only: the code itself runs from /app (its settings find templates/
# beside it), so it is not installed into site-packages a second time.
RUN /opt/agentops/bin/pip install . \
    && /opt/agentops/bin/pip uninstall --yes agentops \
    && /opt/agentops/bin/python -m compileall -q /opt/agentops

FROM python:3.11-slim AS runtime
# A fixed uid/gid, so Kubernetes' runAsUser/fsGroup (deploy/kubernetes/) match the files' owner.
RUN groupadd --system --gid 10001 agentops \
    && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin agentops \
    && mkdir -p /app /data \
    && chown 10001:10001 /data
COPY --from=build /opt/agentops /opt/agentops
WORKDIR /app
COPY manage.py ./
COPY agentops agentops
COPY inference inference
COPY calls calls
COPY waits waits
COPY breaker breaker
COPY turns turns
COPY interfaces interfaces
COPY templates templates
COPY devtools devtools
COPY deploy/docker/entrypoint.sh /usr/local/bin/agentops-entrypoint
# Bytecode compiled here, so a read-only root filesystem costs nothing at start.
RUN /opt/agentops/bin/python -m compileall -q /app
ENV PATH=/opt/agentops/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=agentops.settings \
    AGENTOPS_FAILURES_LOG=/data/failures.log
# /data: failures.log and beat's schedule (a volume in compose, an emptyDir in Kubernetes).
VOLUME ["/data"]
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["agentops-entrypoint"]
CMD ["web"]
