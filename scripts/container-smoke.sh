#!/usr/bin/env bash
# Build the repo's Dockerfile for real with buildah and run it with podman, on a machine with no
# Docker engine and no registry (see ../shared/DOCKER.md): a Debian bookworm base made locally
# with debootstrap stands in for python:3.11-slim. Waits for the health check, checks that the
# app answers and that a heatmap renders from inside the container (Playwright + chromium), then
# removes everything it started. Prints the image size and the cold start time to healthy.
#
#   sudo scripts/container-smoke.sh          (root; installs buildah, podman, runc, debootstrap)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
NAME=mhsa-smoke-$$
IMAGE=localhost/mhsa-explorer:smoke
WORK=${MHSA_SMOKE_WORK:-/tmp/mhsa-smoke}
PORT=${MHSA_SMOKE_PORT:-8599}
mkdir -p "$WORK"

if ! command -v buildah >/dev/null || ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    buildah podman runc debootstrap bc curl >/dev/null
fi

cat > "$WORK/storage.conf" <<CONF
[storage]
driver = "vfs"
runroot = "$WORK/run"
graphroot = "$WORK/graph"
CONF
export CONTAINERS_STORAGE_CONF="$WORK/storage.conf"

cleanup() {
  podman --runtime runc rm -f -v "$NAME" "$NAME-hc" >/dev/null 2>&1 || true
  podman rmi -f "$IMAGE" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# 1. Base image: bookworm minbase with python3 (cached as a tarball between runs).
if ! podman image exists docker.io/library/python:3.11-slim; then
  if [ ! -f "$WORK/rootfs.tar" ]; then
    MIRROR=$(grep -hE '^URIs: .*/debian$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 | awk '{print $2}')
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      bookworm "$WORK/rootfs" "$MIRROR" >/dev/null
    ln -sf python3 "$WORK/rootfs/usr/bin/python"
    rm -f "$WORK"/rootfs/usr/lib/python3*/EXTERNALLY-MANAGED
    tar -C "$WORK/rootfs" -cf "$WORK/rootfs.tar" .
  fi
  podman import --change 'CMD ["/bin/bash"]' "$WORK/rootfs.tar" localhost/bookworm-python >/dev/null
  podman tag localhost/bookworm-python docker.io/library/python:3.11-slim
fi

# 2. Build the real Dockerfile. Here pip must take the CPU torch from this machine's wheel folder
#    (no download index for it): passed as build args and read-only mounts, not baked in.
FIND_LINKS=$(pip config list 2>/dev/null | sed -n "s/^global.find-links='\(.*\)'/\1/p")
MOUNTS=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
PIP_ARGS="--cert /etc/ssl/certs/ca-certificates.crt"
if [ -n "$FIND_LINKS" ]; then MOUNTS+=(-v "$FIND_LINKS:$FIND_LINKS:ro"); PIP_ARGS="$PIP_ARGS --find-links $FIND_LINKS"; fi
# The CPU torch index is out of reach here: point TORCH_INDEX at PyPI itself (a no-op), the
# CPU wheel comes from the find-links folder. On a normal Docker host the default applies.
start=$(date +%s)
buildah bud --format docker --isolation chroot --storage-driver vfs --pull=never \
  "${MOUNTS[@]}" --build-arg "TORCH_INDEX=https://pypi.org/simple" \
  --build-arg "PIP_EXTRA_ARGS=$PIP_ARGS" -t "$IMAGE" "$ROOT" >"$WORK/build.log" 2>&1 \
  || { tail -40 "$WORK/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
podman image inspect "$IMAGE" --format 'image size: {{.Size}} bytes'
podman image inspect "$IMAGE" --format '{{json .Config.Healthcheck}}' | grep -q _stcore/health
# What the README promises of the image, read from the built image itself.
config=$(podman image inspect "$IMAGE" --format '{{.Config.User}} {{json .Config.ExposedPorts}} {{json .Config.Env}} {{json .Config.Volumes}}')
for want in '^10001 ' '"8501/tcp"' '"HF_HUB_OFFLINE=1"' '"MHSA_ALLOWED_MODELS="' '"MHSA_MAX_TOKENS=512"' '"MHSA_STORE=/data"' '"/data":{}'; do
  echo "$config" | grep -q -- "$want" || { echo "image config lacks $want: $config"; exit 1; }
done
echo "image config: user 10001, port 8501, offline, embedded model only by default, store volume /data"

# 3. Run it, time the cold start to healthy.
t0=$(date +%s.%N)
podman --runtime runc run -d --name "$NAME" --network host \
  --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=32768:32768 \
  "$IMAGE" python3 -m ui.serve --server.address=127.0.0.1 --server.port=$PORT >/dev/null
for _ in $(seq 1 120); do
  if curl -fsS "http://127.0.0.1:$PORT/_stcore/health" 2>/dev/null | grep -q ok; then break; fi
  sleep 0.5
done
t1=$(date +%s.%N)
curl -fsS "http://127.0.0.1:$PORT/_stcore/health" | grep -q ok
printf 'healthy after %.1f s\n' "$(echo "$t1 - $t0" | bc)"
# The image's own HEALTHCHECK talks to port 8501; run it against a second container on that port
# only when the port is free, so a developer's running app is never disturbed.
if ! curl -fsS http://127.0.0.1:8501/_stcore/health >/dev/null 2>&1; then
  podman --runtime runc run -d --name "$NAME-hc" --network host \
    --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=32768:32768 "$IMAGE" >/dev/null
  for _ in $(seq 1 120); do
    podman healthcheck run "$NAME-hc" >/dev/null 2>&1 && break
    sleep 0.5
  done
  podman healthcheck run "$NAME-hc" && echo "image HEALTHCHECK: healthy"
  podman --runtime runc rm -f -v "$NAME-hc" >/dev/null
fi
podman --runtime runc exec "$NAME" whoami | grep -qv root && echo "runs as non-root: $(podman --runtime runc exec "$NAME" id -u)"
# A bad MHSA_MAX_HEAVY stops the container at start, with a message naming the variable.
if podman --runtime runc run --rm --network host -e MHSA_MAX_HEAVY=0 \
  --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=32768:32768 \
  "$IMAGE" >"$WORK/bad.log" 2>&1; then
  echo "MHSA_MAX_HEAVY=0 started the server"; exit 1
fi
grep -q "MHSA_MAX_HEAVY" "$WORK/bad.log" || { echo "no message naming MHSA_MAX_HEAVY:"; cat "$WORK/bad.log"; exit 1; }
echo "MHSA_MAX_HEAVY=0: refused at start"
# The model policy inside the running container: a link cannot make it load another model.
podman --runtime runc exec "$NAME" python3 -c "
from mhsa.engine.models.limits import Limits
from mhsa.errors import ModelLoadError
limits = Limits.from_env()
assert limits.allowed_models == (), limits
try:
    limits.check_model('/etc')
except ModelLoadError:
    print('model policy: embedded model only')
else:
    raise SystemExit('the image loads any model')
"

# The store volume is writable by the image's user (ui.serve checked it at start).
podman --runtime runc exec "$NAME" python3 -m mhsa store list >"$WORK/store.log" 2>&1 || true
grep -q "0 entries, 0.00 MB of 2048 MB (MHSA_STORE_MB), in /data" "$WORK/store.log" \
  || { echo "the image's store at /data is not usable:"; cat "$WORK/store.log"; exit 1; }
echo "store: /data, opened by the server at start, listed by python -m mhsa store list"

# The prebuilt atlases open offline: MiniLM's (on the Brown Corpus) and toy:induction's.
podman --runtime runc exec "$NAME" python3 -c "
from mhsa.atlas.shipped import list_atlases
found = list_atlases()
atlas = found['minilm-brown']
assert atlas.tokens > 50_000 and atlas.manifest['index']['kind'] == 'projection', atlas.manifest
assert len(atlas.top('L0H0', k=5)) == 5 and len(atlas.similar(0, 1, k=5)) == 5
assert found['toy-induction'].heads()['induction score'].max() > 0.3
print(f'atlases: {atlas}; {found[\"toy-induction\"]}')
"

# 4. A heatmap renders from inside the container, in Debian's chromium.
"$ROOT/.venv/bin/python" - "$PORT" <<'PY'
import sys
sys.path.insert(0, ".")
from bench.browser import chromium, tick_labels, wait_for_app
port = sys.argv[1]
with chromium() as browser:
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto(f"http://127.0.0.1:{port}/Heads")
    wait_for_app(page, plots=3, timeout_ms=120_000)
    labels = tick_labels(page, 1)
    assert labels == ["[CLS]", "the", "cat", "sat", "on", "the", "mat", ".", "[SEP]"], labels
    print("heatmap rendered from the container:", " ".join(labels))
    page.goto(f"http://127.0.0.1:{port}/Head_atlas")
    wait_for_app(page, plots=4, timeout_ms=120_000)
    assert page.get_by_role("heading", name="Top examples").count() == 1
    assert "minilm-brown" in page.content()  # the picker shows the image's atlas
    print("Head atlas page drawn from the image's atlas")
PY
echo "container smoke test: OK"
