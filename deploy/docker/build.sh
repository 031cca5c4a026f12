#!/usr/bin/env bash
# Builds the ramjet and engine-simulator images without pulling anything:
# static binaries (CGO_ENABLED=0) compiled on this machine, copied with the
# CA bundle and a passwd entry into FROM scratch images.
#
#   deploy/docker/build.sh            # ramjet:<version> + ramjet:latest,
#                                     # ramjet-enginesim:<version> + :latest
#   RAMJET_IMAGE=my/ramjet deploy/docker/build.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

image=${RAMJET_IMAGE:-ramjet}
simimage=${RAMJET_SIM_IMAGE:-ramjet-enginesim}
version=$(sed -n 's/^const Version = "\(.*\)"$/\1/p' version/version.go)
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit-dirty"
fi
ca=${RAMJET_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[ -f "$ca" ] || { echo "build.sh: no CA bundle at $ca (set RAMJET_CA_BUNDLE)" >&2; exit 1; }

ctx=$(mktemp -d "${TMPDIR:-/tmp}/ramjet-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/etc/ssl/certs" "$ctx/data" "$ctx/config"
cp "$ca" "$ctx/etc/ssl/certs/ca-certificates.crt"
echo 'ramjet:x:10001:10001:ramjet:/data:/sbin/nologin' > "$ctx/etc/passwd"
echo 'ramjet:x:10001:' > "$ctx/etc/group"
cp deploy/Caddyfile "$ctx/Caddyfile"

ldflags="-s -w -X github.com/ramjet-llm/ramjet/version.Commit=$commit"
t0=$(date +%s)
# -trimpath keeps host paths out of the release binaries; RAMJET_TRIMPATH=0
# (CI) drops it so that the build reuses the compile cache of the tests.
trim=(-trimpath)
[ "${RAMJET_TRIMPATH:-1}" = 0 ] && trim=()
CGO_ENABLED=0 go build "${trim[@]}" -ldflags "$ldflags" -o "$ctx/ramjet" ./xcaddy
CGO_ENABLED=0 go build "${trim[@]}" -ldflags "-s -w" -o "$ctx/enginesim" ./bench/cmd/enginesim
echo "build.sh: binaries built in $(( $(date +%s) - t0 ))s"
caddy=$("$ctx/ramjet" version --json | sed -n 's/.*"caddy":"\([^"]*\)".*/\1/p')

args=(--build-arg "RAMJET_VERSION=$version" --build-arg "RAMJET_COMMIT=$commit")
docker build -q -f deploy/docker/Dockerfile "${args[@]}" --build-arg "CADDY_VERSION=$caddy" \
  -t "$image:$version" -t "$image:latest" "$ctx"
docker build -q -f deploy/docker/Dockerfile.enginesim "${args[@]}" \
  -t "$simimage:$version" -t "$simimage:latest" "$ctx"
echo "build.sh: $image:$version ($commit, Caddy $caddy) and $simimage:$version in $(( $(date +%s) - t0 ))s"
