FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md ./
COPY agentops agentops
COPY inference inference
COPY calls calls
COPY waits waits
COPY breaker breaker
COPY turns turns
COPY interfaces interfaces
COPY templates templates
COPY devtools devtools
COPY manage.py ./
RUN pip install .
EXPOSE 8000
CMD ["uvicorn", "interfaces.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--proxy-headers", "--forwarded-allow-ips", "*"]
