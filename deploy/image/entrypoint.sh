#!/bin/bash
# The image's entry point: the first argument picks the role (deploy/README.md, "Roles").
set -euo pipefail

usage() {
  cat <<'USAGE'
mxrec image: the first argument picks the role.
  serve ARGS    the predictor: python -m mxrec.serving ARGS (pass --host 0.0.0.0)
  train ARGS    the streaming trainer on one process: python -m mxrec.streaming train ARGS
  launch ARGS   local ranks: python -m mxrec.launch ARGS
  worker        an MPIJob worker: sshd on port 2222 (keys in ~/.ssh, mounted by the operator)
  mpirun ARGS   an MPIJob launcher (or any other command): runs as given
  help          this text
Each role's own --help lists its flags (e.g. `serve --help`).
USAGE
}

role=${1:-help}
case "$role" in
  serve) shift; exec python -m mxrec.serving "$@" ;;
  train) shift; exec python -m mxrec.streaming train "$@" ;;
  launch) shift; exec python -m mxrec.launch "$@" ;;
  worker)
    shift
    if [ ! -r "$HOME/.ssh/id_rsa" ] || [ ! -r "$HOME/.ssh/authorized_keys" ]; then
      echo "mxrec-entrypoint: worker: no $HOME/.ssh/id_rsa and authorized_keys; an MPIJob" \
           "mounts them when its sshAuthMountPath is $HOME/.ssh" >&2
      exit 2
    fi
    # -D: stay in the foreground as the container's process; -e: log to stderr.
    exec /usr/sbin/sshd -D -e -f /etc/mxrec/sshd_config "$@" ;;
  help | --help | -h) usage ;;
  *) exec "$@" ;;
esac
