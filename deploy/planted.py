"""deploy/check.py --self-test: one planted error per check, each to be caught by its check.

Every plant changes a copy of the files in memory; the files themselves are never touched.
"""

import copy


def _doc(recipe, kind, name=None):
    for _, doc in recipe.manifests:
        if doc.get("kind") == kind and (name is None or doc["metadata"]["name"] == name):
            return doc
    raise LookupError(f"no {kind} {name or ''} in deploy/k8s")


def _replica(recipe, replica):
    return _doc(recipe, "MPIJob")["spec"]["mpiReplicaSpecs"][replica]["template"]["spec"]


def _predictor(recipe):
    return _doc(recipe, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def _set_arg(args, flag, value):
    args[args.index(flag) + 1] = value


def _unpinned_apt(recipe):
    recipe.dockerfile = recipe.dockerfile.replace("tini=0.19.0-1+b3", "tini", 1)


def _recommends(recipe):
    recipe.dockerfile = recipe.dockerfile.replace("--no-install-recommends", "", 1)


def _latest_base(recipe):
    recipe.dockerfile = recipe.dockerfile.replace("ARG BASE_IMAGE=debian:12.15-slim",
                                                  "ARG BASE_IMAGE=debian:latest", 1)


def _probe_typo(recipe):
    container = _predictor(recipe)
    container["readinesProbe"] = container.pop("readinessProbe")


def _port_as_text(recipe):
    _doc(recipe, "Service")["spec"]["ports"][0]["port"] = "8501"


def _worker_template_typo(recipe):
    container = _replica(recipe, "Worker")["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")


def _mpi_implementation(recipe):
    _doc(recipe, "MPIJob")["spec"]["mpiImplementation"] = "OpenMPi"


def _slots_typo(recipe):
    spec = _doc(recipe, "MPIJob")["spec"]
    spec["slotPerWorker"] = spec.pop("slotsPerWorker")


def _local_host(recipe):
    _set_arg(_predictor(recipe)["args"], "--host", "127.0.0.1")


def _readiness_elsewhere(recipe):
    _predictor(recipe)["readinessProbe"]["httpGet"]["path"] = "/v1/models/other"


def _writable_export(recipe):
    _predictor(recipe)["volumeMounts"][0]["readOnly"] = False


def _model_dir_local(recipe):
    args = _replica(recipe, "Launcher")["containers"][0]["args"]
    _set_arg(args, "--model-dir", "/local/model")


def _unknown_flag(recipe):
    _replica(recipe, "Launcher")["containers"][0]["args"] += ["--vocab", "10"]


def _threads_over_limit(recipe):
    for entry in _replica(recipe, "Launcher")["containers"][0]["env"]:
        if entry["name"] == "TF_NUM_INTRAOP_THREADS":
            entry["value"] = "4"


def _worker_mount_moved(recipe):
    for mount in _replica(recipe, "Worker")["containers"][0]["volumeMounts"]:
        if mount["mountPath"] == "/shared":
            mount["mountPath"] = "/mnt/shared"


def _root_user(recipe):
    recipe.dockerfile = recipe.dockerfile.replace("USER 1000:1000", "USER 0", 1)


def _no_limits(recipe):
    del _predictor(recipe)["resources"]["limits"]


def _ssh_keys_elsewhere(recipe):
    _doc(recipe, "MPIJob")["spec"]["sshAuthMountPath"] = "/root/.ssh"


PLANTS = [
    ("an apt package without its version", "hadolint", _unpinned_apt),
    ("apt-get install with recommended packages", "hadolint", _recommends),
    ("a base image tagged latest", "recipe", _latest_base),
    ("a misspelt field in the Deployment (readinesProbe)", "kubernetes-validate", _probe_typo),
    ("a Service port given as text", "kubernetes-validate", _port_as_text),
    ("a misspelt field in the MPIJob's worker template", "kubernetes-validate",
     _worker_template_typo),
    ("mpiImplementation OpenMPi", "MPIJob CRD schema", _mpi_implementation),
    ("a misspelt MPIJob field (slotPerWorker)", "MPIJob CRD schema", _slots_typo),
    ("the predictor on --host 127.0.0.1", "recipe", _local_host),
    ("a readiness probe on another model's status", "recipe", _readiness_elsewhere),
    ("the export base mounted writable", "recipe", _writable_export),
    ("--model-dir on the worker's local disk", "recipe", _model_dir_local),
    ("a flag the trainer does not have (--vocab)", "recipe", _unknown_flag),
    ("4 threads x 2 slots on 4 CPUs", "recipe", _threads_over_limit),
    ("the shared volume at another path on the workers", "recipe", _worker_mount_moved),
    ("the image's user root", "recipe", _root_user),
    ("a container without limits", "recipe", _no_limits),
    ("the ssh keys mounted where sshd does not look", "recipe", _ssh_keys_elsewhere),
]


def self_test(recipe, version, schema, run_checks):
    """Runs every plant; True when each was caught by the check it names."""
    ok = True
    print(f"self-test: {len(PLANTS)} planted errors")
    for description, check, plant in PLANTS:
        planted = copy.deepcopy(recipe)
        plant(planted)
        findings = run_checks(planted, version, schema, only=check)[check]
        if findings:
            print(f"  caught by {check}: {description}: {findings[0]}")
        else:
            print(f"  MISSED by {check}: {description}")
            ok = False
    return ok
