# Every target runs through scripts/with-node.sh, which provides Node 24 and the dependencies on a fresh machine.
RUN := ./scripts/with-node.sh

.PHONY: dev test test-tools tollgate lint build bench install image

dev:        ## start Tollgate on its embedded default (tollgate dev); installs the runtime dependencies only
	WITH_NODE_DEPS=runtime $(RUN) npm run dev

test: test-tools  ## run the whole test suite (installs what its tests need first, as CI does)
	$(RUN) npm test

test-tools: ## Chromium, Prometheus (root: apt-get), helm and kubectl (.tools/bin); quick when present
	$(RUN) bash scripts/test-tools.sh

tollgate:   ## the CLI on the Node `make dev` uses: make tollgate ARGS="users deposit --project … --user … --amount 5.00"
	./scripts/tollgate $(ARGS)

lint:       ## biome (lint + format check) and the TypeScript type check
	$(RUN) npm run lint

build:      ## bundle the command into dist/bin/ (rolldown) and compile the webhook verifier to dist/src/
	$(RUN) npm run build

bench:      ## run the benchmarks (results in docs/benchmarks.md)
	$(RUN) npm run bench

image:      ## build the container image with podman and smoke-test it (scripts/image.sh; see docs/deploying.md)
	$(RUN) bash scripts/image.sh

install:
	$(RUN) true
