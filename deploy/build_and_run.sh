#!/usr/bin/env bash
# Builds deploy/Dockerfile with podman on a Debian 12 base made by debootstrap (so no registry of
# images is needed, only Debian's and Python's package registries), then runs the image:
#   1. the predictor (read-only root filesystem, the export base mounted read-only) on an empty
#      export base: its status answers 404, `mxrec-healthcheck --live` passes, `--ready` fails;
#   2. the streaming trainer on 2 ranks over the MPI engine (`launch -n 2`), read-only root too,
#      in a second container, on a small generated partition: it delivers version 1;
#   3. the predictor serves it: the image's HEALTHCHECK turns healthy, a `raw` predict answers;
#   4. an MPIJob as the operator runs it, in containers on a network of their own
#      (198.18.0.0/24): 2 `worker` containers (sshd as uid 1000, the job's key pair mounted
#      read-only and root-owned as from a Secret) and a launcher whose `mpirun --hostfile` starts
#      one rank on each over ssh, with deploy/k8s/trainer-mpijob.yaml's mpirun options; the
#      trainer resumes on a second partition and the predictor serves its version 2.
# Usage (as root: debootstrap and rootful podman):
#   apt-get install podman debootstrap     # Debian 12 ("runc" too where crun refuses the cgroups)
#   bash deploy/build_and_run.sh [WORK_DIR]  # default /tmp/mxrec-deploy; reused between runs
# Environment: MXREC_IMAGE (the tag, default localhost/mxrec:dev), MXREC_DEBIAN_MIRROR
# (default http://deb.debian.org/debian), MXREC_PODMAN_RUNTIME (crun, runc; default: podman's,
# or runc where the machine mixes cgroup v1 and v2 controllers, which crun refuses),
# MXREC_PORT (the predictor's port on 127.0.0.1, default 18501), MXREC_BUILD_CA (a CA bundle
# for pip in the build, default pip's own cert setting here), PIP_INDEX_URL (passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(realpath -m "${1:-/tmp/mxrec-deploy}")
image=${MXREC_IMAGE:-localhost/mxrec:dev}
base=localhost/debian:12-debootstrap
port=${MXREC_PORT:-18501}
mirror=${MXREC_DEBIAN_MIRROR:-http://deb.debian.org/debian}

die() { echo "deploy/build_and_run.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, rootful podman)"
for tool in podman debootstrap git; do
  command -v "$tool" > /dev/null || die "no $tool on PATH (apt-get install podman debootstrap git)"
done

podman_args=()
runtime=${MXREC_PODMAN_RUNTIME:-}
if [ -z "$runtime" ] && [ -d /sys/fs/cgroup/unified ] && [ -d /sys/fs/cgroup/memory ]; then
  command -v runc > /dev/null || die "cgroup v1 and v2 mixed here, which crun refuses: apt-get install runc"
  runtime=runc
fi
[ -z "$runtime" ] || podman_args+=(--runtime "$runtime")
pod() { podman "${podman_args[@]}" "$@"; }
# podman asks for more open files and processes than a container (such as a CI sandbox) may
# allow: ask for this shell's open files, and for 16384 processes (threads count) per user
# or this shell's limit if lower (runc could not set this sandbox's own 96553). The build's RUN
# steps take only the first: runc refused them an nproc limit here.
build_limits=(--ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)")
nproc=$(ulimit -Hu); [ "$nproc" != unlimited ] && [ "$nproc" -lt 16384 ] || nproc=16384
limits=("${build_limits[@]}" --ulimit "nproc=$nproc:$nproc")
# The manifests' securityContext: no capabilities, no privilege escalation, uid 1000.
limits+=(--cap-drop all --security-opt no-new-privileges)

mkdir -p "$work"
if ! pod image exists "$base"; then
  echo "== debootstrap: Debian 12 (minbase) into $work/rootfs"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log"; die "debootstrap failed ($work/debootstrap.log)"; }
  tar -C "$work/rootfs" -c . | pod import --change 'CMD ["/bin/bash"]' - "$base" > /dev/null
  rm -rf "$work/rootfs"
fi

echo "== build $image (the files git tracks or would track; no build products)"
rm -rf "$work/context" && mkdir -p "$work/context"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -c | tar -C "$work/context" -x
build_args=(--build-arg "BASE_IMAGE=$base")
# pip in the build trusts certifi's CAs only; where this machine's pip needs another bundle (a
# TLS-inspecting proxy), the same bundle is mounted into the build's RUN steps.
ca=${MXREC_BUILD_CA:-${PIP_CERT:-$(python3 -m pip config get global.cert 2>/dev/null || true)}}
if [ -n "$ca" ]; then
  [ -r "$ca" ] || die "the CA bundle $ca (MXREC_BUILD_CA or pip's cert) cannot be read"
  build_args+=(--volume "$(realpath "$ca"):/tmp/mxrec-build-ca.pem:ro"
               --build-arg PIP_CERT=/tmp/mxrec-build-ca.pem)
fi
[ -z "${PIP_INDEX_URL:-}" ] || build_args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
start=$SECONDS
pod build "${build_limits[@]}" --format docker "${build_args[@]}" \
  -f "$work/context/deploy/Dockerfile" -t "$image" "$work/context"
echo "== built in $((SECONDS - start)) s: $(pod image inspect --format '{{.Size}}' "$image") bytes"

shared=$work/shared
rm -rf "$shared" && mkdir -p "$shared/data" "$shared/model" "$shared/export"
chown -R 1000:1000 "$shared"  # the image's user
net=mxrec-deploy-test
cleanup() {  # one at a time: podman 4.3 stops at the first name that does not exist
  for name in mxrec-predictor mxrec-trainer mxrec-launcher mxrec-worker-0 mxrec-worker-1; do
    pod rm -f "$name" > /dev/null 2>&1 || true
  done
  pod network rm -f "$net" > /dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup

echo "== predictor on an empty export base"
pod run -d --name mxrec-predictor "${limits[@]}" --read-only --tmpfs /tmp \
  -p "127.0.0.1:$port:8501" -v "$shared/export:/models/ctr:ro" "$image" \
  serve --export-base /models/ctr --model-name ctr --host 0.0.0.0 --port 8501 > /dev/null
for _ in $(seq 120); do
  pod exec mxrec-predictor mxrec-healthcheck --live > /dev/null 2>&1 && break
  sleep 1
done
pod exec mxrec-predictor mxrec-healthcheck --live \
  || { pod logs mxrec-predictor; die "the predictor never answered its status endpoint"; }
if pod exec mxrec-predictor mxrec-healthcheck --ready; then
  die "--ready passed with no version in the export base"
fi

echo "== trainer: 2 ranks (MPI engine) on one generated partition"
partition() {  # NAME SEED: a generated partition of the schema below, made ready
  pod run --rm --name mxrec-trainer "${limits[@]}" -v "$shared:/shared" "$image" python -c '
import os, random, sys
folder = "/shared/data/" + sys.argv[1]
os.makedirs(folder)
rng = random.Random(int(sys.argv[2]))
with open(os.path.join(folder, "part-00000"), "w") as f:
    for _ in range(2000):
        cats = [rng.randrange(50) for _ in range(3)]
        label = int(rng.random() < (0.8 if cats[0] < 10 else 0.2))
        f.write("\t".join([str(label), str(rng.randrange(100))] + [f"v{c}" for c in cats]) + "\n")
open(os.path.join(folder, "_SUCCESS"), "w").close()
' "$@"
}
schema=y:label,d0:dense,c0:categorical,c1:categorical,c2:categorical
partition 20240101/00 0
pod run --rm --name mxrec-trainer "${limits[@]}" --read-only --tmpfs /tmp --shm-size 256m -v "$shared:/shared" "$image" \
  launch -n 2 --timeout 600 -m mxrec.streaming train --data /shared/data \
  --model-dir /shared/model --export-base /shared/export \
  --schema "$schema" \
  --batch-size 256 --dim 4 --hidden 8 --vocabulary 1000 --no-tensorboard
ls "$shared/export"

echo "== predictor serves version 1"
for _ in $(seq 60); do
  pod healthcheck run mxrec-predictor > /dev/null 2>&1 && break
  sleep 1
done
pod healthcheck run mxrec-predictor || { pod logs mxrec-predictor; die "the image's HEALTHCHECK never passed"; }
python3 - "$port" <<'EOF'
import json, sys, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}/v1/models/ctr"
status = json.load(urllib.request.urlopen(base, timeout=10))
print("status:", status)
body = json.dumps({"signature_name": "raw", "instances": [
    {"c0": "v3", "c1": "v7", "c2": "v11", "d0": 42.0},
    {"c0": "v30", "c1": "v7", "c2": "v11", "d0": 42.0}]}).encode()
answer = json.load(urllib.request.urlopen(urllib.request.Request(base + ":predict", body), timeout=30))
print("predict:", answer)
probs = [p["prob"] for p in answer["predictions"]]
if len(probs) != 2 or not all(0 < p < 1 for p in probs):
    sys.exit(f"unexpected predictions {answer}")
EOF

echo "== an MPIJob in containers: a launcher and 2 workers on $net"
pod network create --subnet 198.18.0.0/24 "$net" > /dev/null
# The job's key pair as the operator makes it (ECDSA P-521 in a file named id_rsa) and
# mounts it from a Secret: owned by root, mode 0644.
rm -rf "$work/ssh" && mkdir -p "$work/ssh"
pod run --rm --user 0:0 "${limits[@]}" -v "$work/ssh:/keys" "$image" \
  ssh-keygen -q -t ecdsa -b 521 -N "" -C mxrec-deploy-test -f /keys/id_rsa
cp "$work/ssh/id_rsa.pub" "$work/ssh/authorized_keys"
chown -R 0:0 "$work/ssh" && chmod 0644 "$work/ssh"/* && chmod 0755 "$work/ssh"
printf '%s\n' "198.18.0.10 slots=1" "198.18.0.11 slots=1" > "$work/hostfile"
for i in 0 1; do
  pod run -d --name "mxrec-worker-$i" --hostname "mxrec-worker-$i" "${limits[@]}" --read-only \
    --tmpfs /tmp --shm-size 256m --network "$net" --ip "198.18.0.1$i" -v "$shared:/shared" \
    -v "$work/ssh:/home/mxrec/.ssh:ro" "$image" worker > /dev/null
done
partition 20240101/01 1
threads=(-e TF_NUM_INTRAOP_THREADS=1 -e TF_NUM_INTEROP_THREADS=1 -e KEY_PROCESS_THREAD_NUM=1
         -e OMP_NUM_THREADS=1)
pod run --rm --name mxrec-launcher --hostname mxrec-launcher "${limits[@]}" --read-only \
  --tmpfs /tmp --network "$net" --ip 198.18.0.2 "${threads[@]}" -v "$shared:/shared" \
  -v "$work/ssh:/home/mxrec/.ssh:ro" -v "$work/hostfile:/etc/mpi/hostfile:ro" "$image" \
  bash -c 'for i in $(seq 60); do  # the readiness probe: sshd answers on both workers
             ssh -o ConnectTimeout=2 198.18.0.10 true && ssh -o ConnectTimeout=2 198.18.0.11 true \
               && break; sleep 1; done; exec "$@"' launcher \
  mpirun --hostfile /etc/mpi/hostfile --bind-to none -x PATH -x TF_NUM_INTRAOP_THREADS \
  -x TF_NUM_INTEROP_THREADS -x KEY_PROCESS_THREAD_NUM -x OMP_NUM_THREADS -x TF_CPP_MIN_LOG_LEVEL \
  -x PYTHONUNBUFFERED python -m mxrec.streaming train --data /shared/data \
  --model-dir /shared/model --export-base /shared/export --schema "$schema" \
  --batch-size 256 --dim 4 --hidden 8 --vocabulary 1000 --no-tensorboard
tail -n 2 "$shared/model/donefile.jsonl"
for _ in $(seq 60); do
  pod logs mxrec-predictor 2>&1 | grep -q "serving version 2" && break
  sleep 1
done
pod logs mxrec-predictor 2>&1 | grep -E "serving|refused" | tail -n 3
pod logs mxrec-predictor 2>&1 | grep -q "serving version 2" \
  || die "the predictor never served the MPIJob's version 2"
pod exec mxrec-predictor mxrec-healthcheck
echo "== deploy/build_and_run.sh: passed"
