# One image for every process of the portal (web, worker, beat, agent).

# The browser libraries the portal serves from static/ (xterm.js: package.json), installed
# from the lock in a stage of their own: the image gets node_modules, not node.
FROM node:20-slim AS browser-libs
WORKDIR /build
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund

FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=portal.settings.prod
COPY pyproject.toml README.md ./
COPY fabric ./fabric
COPY scheduler ./scheduler
COPY workers ./workers
COPY edl ./edl
COPY utilities ./utilities
COPY audit ./audit
COPY tenancy ./tenancy
COPY inventory ./inventory
COPY bundles ./bundles
COPY jobs ./jobs
COPY control ./control
COPY notifications ./notifications
COPY shells ./shells
COPY portal ./portal
COPY portalctl ./portalctl
COPY devtools ./devtools
RUN pip install --no-cache-dir .
# .dockerignore keeps var/ (local databases and secrets), .venv, .git and caches out.
COPY . .
# After the context: the lock's packages, whatever a local node_modules held.
COPY --from=browser-libs /build/node_modules ./node_modules
EXPOSE 8000
CMD ["python", "-m", "daphne", "-b", "0.0.0.0", "-p", "8000", "portal.asgi:application"]
