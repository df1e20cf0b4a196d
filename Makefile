# Every target runs through scripts/with-node.sh, which provides Node 24 and the dependencies on a fresh machine.
RUN := ./scripts/with-node.sh

.PHONY: dev test lint build bench install image

dev:        ## start Tollgate on its embedded default (tollgate dev)
	$(RUN) npm run dev

test:       ## run the whole test suite
	$(RUN) npm test

lint:       ## biome (lint + format check) and the TypeScript type check
	$(RUN) npm run lint

build:      ## compile to dist/
	$(RUN) npm run build

bench:      ## run the benchmarks (results in docs/benchmarks.md)
	$(RUN) npm run bench

image:      ## build the container image with podman and smoke-test it (scripts/image.sh; see README "Deploying")
	$(RUN) bash scripts/image.sh

install:
	$(RUN) true
