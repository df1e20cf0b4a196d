# syntax=docker/dockerfile:1
# One image for `tollgate proxy`, `tollgate operator` and `tollgate migrate` (the Helm chart runs all three).
#   docker build -t tollgate:0.1.0 .
#   docker run --rm -p 8080:8080 -e DATABASE_URL=… -e TOLLGATE_ENCRYPTION_KEY=… tollgate:0.1.0 proxy
# The runtime runs as a non-root user and writes nothing outside /tmp, so it runs with a read-only root
# filesystem (mount an emptyDir at /tmp, as the chart does).

ARG NODE_IMAGE=node:24-bookworm-slim

# ---- build: compile TypeScript to dist/ ----
FROM ${NODE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY cmd ./cmd
COPY src ./src
RUN npm run build \
  && chmod 0755 dist/cmd/tollgate.js

# ---- production dependencies only ----
FROM ${NODE_IMAGE} AS deps
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund \
  && npm cache clean --force

# ---- runtime ----
FROM ${NODE_IMAGE} AS runtime
ENV NODE_ENV=production \
    TOLLGATE_DATA_DIR=/tmp/tollgate \
    PORT=8080 \
    OPERATOR_PORT=8081
RUN groupadd --system --gid 10001 tollgate \
  && useradd --system --uid 10001 --gid tollgate --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin tollgate
WORKDIR /app
COPY --from=deps /src/node_modules ./node_modules
COPY --from=build /src/dist ./dist
COPY package.json ./
COPY crds ./crds
RUN ln -s /app/dist/cmd/tollgate.js /usr/local/bin/tollgate
USER 10001:10001
EXPOSE 8080 8081
ENTRYPOINT ["node", "/app/dist/cmd/tollgate.js"]
CMD ["proxy"]
