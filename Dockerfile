# syntax=docker/dockerfile:1
# One image for `tollgate proxy`, `tollgate operator`, `tollgate worker`, `tollgate migrate` and `tollgate dev`
# (the Helm chart runs the first three, compose.yaml the proxy, the worker and the migrations).
#   docker build -t tollgate:0.1.0 .
#   docker run --rm -p 8080:8080 -e DATABASE_URL=… -e TOLLGATE_ENCRYPTION_KEY=… tollgate:0.1.0 proxy
# The runtime runs as a non-root user and writes nothing outside /tmp, so it runs with a read-only root
# filesystem (mount an emptyDir at /tmp, as the chart does).
#
# NODE_IMAGE builds (it needs npm); the runtime is BASE_IMAGE, the same Debian release, plus the `node`
# binary alone: no npm, corepack, yarn or C headers in production. scripts/image.sh passes stand-ins for
# both where no registry of container images is reachable.
#
# Behind a TLS-intercepting proxy, give npm its CA as a build secret (never baked into a layer):
#   docker build --secret id=npm_ca,src=/etc/ssl/certs/ca-certificates.crt …

ARG NODE_IMAGE=node:24-bookworm-slim
ARG BASE_IMAGE=debian:bookworm-slim

# ---- every dependency, from the lockfile ----
FROM ${NODE_IMAGE} AS modules
WORKDIR /src
COPY package.json package-lock.json ./
RUN --mount=type=secret,id=npm_ca \
  if [ -s /run/secrets/npm_ca ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/npm_ca; fi; \
  npm ci --no-audit --no-fund --loglevel=error

# ---- build: bundle the command into dist/bin/ (rolldown.config.ts) ----
FROM modules AS build
COPY tsconfig.json tsconfig.build.json rolldown.config.ts ./
COPY cmd ./cmd
COPY src ./src
RUN npm run build \
  && chmod 0755 dist/bin/tollgate.js \
  && find dist -name '*.map' -delete

# ---- the few files of node_modules the bundle reads at run time ----
# rolldown.config.ts lists them (runtimeFiles): the embedded Postgres of `tollgate dev`, the tokenizer's
# o200k table and `yaml`, and the common-password list of sign-up; everything else is inside dist/bin.
# Copied from the same install (no second download), without TypeScript sources and declarations,
# source maps and markdown.
FROM modules AS deps
COPY rolldown.config.ts ./
COPY src/admin/common-passwords.txt ./src/admin/
RUN mkdir /runtime \
  && node -e "import('./rolldown.config.ts').then((m) => console.log(m.runtimeFiles.join('\\n')))" > /tmp/runtime-files \
  && test -s /tmp/runtime-files \
  && while read -r file; do cp -a --parents "$file" /runtime/; done < /tmp/runtime-files \
  && find /runtime/node_modules -type f \( -name '*.ts' -o -name '*.mts' -o -name '*.cts' -o -name '*.map' \
       -o -iname '*.md' -o -iname '*.markdown' \) -delete

# ---- runtime ----
FROM ${BASE_IMAGE} AS runtime
ENV NODE_ENV=production \
    TOLLGATE_DATA_DIR=/tmp/tollgate \
    PORT=8080 \
    OPERATOR_PORT=8081
COPY --from=build /usr/local/bin/node /usr/local/bin/node
RUN groupadd --system --gid 10001 tollgate \
  && useradd --system --uid 10001 --gid tollgate --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin tollgate \
  && node --version
WORKDIR /app
COPY --from=deps /runtime ./
COPY --from=build /src/dist ./dist
COPY package.json ./
COPY README.md ./
COPY docs ./docs
COPY crds ./crds
RUN ln -s /app/dist/bin/tollgate.js /usr/local/bin/tollgate
USER 10001:10001
EXPOSE 8080 8081
# A 16 MB semi-space (V8's default grows the young generation to 2 × 64 MB on a machine with this much
# memory): about 100 MB less resident memory under load for a few more, short, scavenges (docs/deploying.md, The image).
ENTRYPOINT ["node", "--max-semi-space-size=16", "/app/dist/bin/tollgate.js"]
CMD ["proxy"]
