#!/usr/bin/env bash
# The Docker end-to-end test of the deployment surface, in one command:
#
#   deploy/test/compose-e2e.sh
#
# builds the images (deploy/docker/build.sh, nothing pulled), brings up
# deploy/compose/simulated and deploy/compose/https on the real Docker
# engine, drives them with the OpenAI Go SDK (chat, streaming, tool call,
# cached_tokens on a second turn, /metrics, an engine stopped and started
# with no failed request, HTTPS with the local CA and HTTP/2), runs
# `docker-compose config` on every Compose file, and tears everything
# down. Needs a running Docker engine and docker-compose; exits 0 with a
# SKIP line when there is none and RAMJET_COMPOSE_REQUIRED is not 1.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! docker info >/dev/null 2>&1; then
  if [ "${RAMJET_COMPOSE_REQUIRED:-0}" = 1 ]; then
    echo "compose-e2e: no Docker engine answers (docker info failed)" >&2; exit 1
  fi
  echo "compose-e2e: SKIP: no Docker engine answers (install docker.io, start dockerd)"; exit 0
fi
if ! command -v docker-compose >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then
  if [ "${RAMJET_COMPOSE_REQUIRED:-0}" = 1 ]; then
    echo "compose-e2e: neither docker-compose nor docker compose is installed" >&2; exit 1
  fi
  echo "compose-e2e: SKIP: docker-compose is not installed (apt-get install docker-compose)"; exit 0
fi
RAMJET_TEST_COMPOSE=1 exec go test ./deploy/test/ -count=1 -v -timeout 20m "$@"
