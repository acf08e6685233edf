#!/usr/bin/env bash
# Offline checks of the deployment recipe under deploy/ (no cluster, no image registry):
# hadolint on deploy/Dockerfile, kubernetes-validate on deploy/k8s/ (strict, Kubernetes
# 1.33.0), the MPIJob against its CRD's schema (deploy/schemas/), the recipe's own agreements,
# and a self-test that plants one error per check and fails unless each is caught
# (deploy/check.py). Any finding fails.
# The tools live in a venv of their own, build/deploy-check-venv (pinned versions from
# deploy/check-requirements.txt, installed once; about 170 MB), not in the project's .venv.
# PYTHON picks the interpreter that makes it (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/deploy-check-venv
stamp=$venv/.requirements
if [ ! -x "$venv/bin/python" ] || ! cmp -s deploy/check-requirements.txt "$stamp"; then
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    -r deploy/check-requirements.txt
  cp deploy/check-requirements.txt "$stamp"
fi
"$venv/bin/python" deploy/check.py --self-test "$@"
