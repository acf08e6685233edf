"""Offline checks of deploy/ (no cluster, no network): run by scripts/check_deploy.sh.

    python deploy/check.py [--self-test] [--kubernetes-version 1.33.0]

1. hadolint on deploy/Dockerfile: any finding, style included, fails.
2. kubernetes-validate, strict (an unknown field is an error), at the pinned Kubernetes
   version: every core object in deploy/k8s/, and each MPIJob replica's pod template as a
   core PodTemplate.
3. jsonschema: every MPIJob against the openAPIV3Schema of the stored CRD
   (deploy/schemas/kubeflow.org_mpijobs.yaml), strict as the API server's field validation:
   an unknown field is an error.
4. The recipe's own agreements, which no schema knows: one image everywhere; requests and
   limits on every container; the image's uid; the trainer's and predictor's command lines
   parsed by mxrec's own parsers; the shared volume at one path on every trainer pod with
   --data, --model-dir and --export-base on it; the predictor's export base the trainer's,
   mounted read-only; --host 0.0.0.0; probes, port and Service on the predictor's --port and
   /v1/models/<--model-name>; the ranks' thread pools within the worker's CPU limit; sshd's
   port and key folder where the MPIJob puts them.

--self-test plants one error per check in copies of the files (the files are not touched)
and fails unless every one is caught, by the check meant to catch it, and the files as they
are pass.
"""

import argparse
import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
CRD = DEPLOY / "schemas" / "kubeflow.org_mpijobs.yaml"
KUBERNETES_VERSION = "1.33.0"
CORE_KINDS = ("Deployment", "Service", "PersistentVolumeClaim")


class Recipe:
    """The files under check: the Dockerfile's text, the image's sshd_config, the manifests."""

    def __init__(self, dockerfile, sshd_config, manifests):
        self.dockerfile = dockerfile
        self.sshd_config = sshd_config
        self.manifests = manifests  # [(file name, document)]

    @classmethod
    def load(cls):
        manifests = []
        for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc is not None:
                    manifests.append((path.name, doc))
        return cls((DEPLOY / "Dockerfile").read_text(),
                   (DEPLOY / "image" / "sshd_config").read_text(), manifests)

    def of_kind(self, kind):
        return [(name, doc) for name, doc in self.manifests if doc.get("kind") == kind]


def where(name, doc):
    return f"{name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


# 1. hadolint -------------------------------------------------------------------------------

def check_dockerfile(recipe):
    hadolint = Path(sys.executable).with_name("hadolint")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "Dockerfile"
        path.write_text(recipe.dockerfile)
        proc = subprocess.run([str(hadolint), "--no-color", "--failure-threshold", "style",
                               str(path)], capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).replace(str(path), "deploy/Dockerfile").splitlines()
    if proc.returncode == 0:
        return []
    return [f"hadolint: {line}" for line in lines if line.strip()] or [
        f"hadolint: exit status {proc.returncode}"]


# 2. kubernetes-validate ----------------------------------------------------------------------

def _validate_core(doc, label, version):
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.absolute_path)
        return [f"kubernetes-validate {version}: {label}: {path}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [f"kubernetes-validate {version}: {label}: {error.message}"]
    return []


def check_core_kinds(recipe, version):
    findings = []
    for name, doc in recipe.manifests:
        if doc.get("kind") == "MPIJob":
            for replica, spec in doc.get("spec", {}).get("mpiReplicaSpecs", {}).items():
                template = {"apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": f"{doc['metadata']['name']}-{replica.lower()}"},
                            "template": spec.get("template", {})}
                findings += _validate_core(template, f"{where(name, doc)} {replica} template",
                                           version)
        elif doc.get("kind") in CORE_KINDS:
            findings += _validate_core(doc, where(name, doc), version)
        else:
            findings.append(f"{where(name, doc)}: no check knows this kind")
    return findings


# 3. the MPIJob's CRD -------------------------------------------------------------------------

def _strict(schema):
    """The schema with unknown fields refused, as kubectl's default field validation does
    for a custom resource: wherever an object lists its properties and neither keeps unknown
    fields (x-kubernetes-preserve-unknown-fields) nor says what else it takes."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def mpijob_schema():
    crd = yaml.safe_load(CRD.read_text())
    for version in crd["spec"]["versions"]:
        if version["name"] == "v2beta1":
            return _strict(version["schema"]["openAPIV3Schema"])
    raise ValueError(f"{CRD} has no v2beta1 version")


def check_mpijobs(recipe, schema):
    findings = []
    validator = jsonschema.Draft7Validator(schema)
    for name, doc in recipe.of_kind("MPIJob"):
        if doc.get("apiVersion") != "kubeflow.org/v2beta1":
            findings.append(f"{where(name, doc)}: apiVersion {doc.get('apiVersion')!r}, the "
                            "stored CRD is kubeflow.org/v2beta1")
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            path = ".".join(str(p) for p in error.absolute_path)
            findings.append(f"MPIJob CRD schema: {where(name, doc)}: {path}: {error.message}")
    return findings


# 4. the recipe's agreements ------------------------------------------------------------------

def _load_parser(relative, name):
    """build_parser() of one of mxrec's CLI modules, read from its file: they import only the
    standard library at the top, so this venv needs neither TensorFlow nor mxrec's build."""
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


def parse_cli(relative, argv, label, findings):
    parser = _load_parser(relative, "_mxrec_cli_" + Path(relative).parent.name)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return parser.parse_args(argv)
    except SystemExit:
        message = errors.getvalue().strip().splitlines()
        findings.append(f"{label}: {relative} refuses the command line: "
                        f"{message[-1] if message else argv}")
        return None


def pod_specs(recipe):
    """[(label, pod spec, labels)] of every pod the manifests make."""
    pods = []
    for name, doc in recipe.of_kind("Deployment"):
        template = doc["spec"]["template"]
        pods.append((where(name, doc), template["spec"], template["metadata"].get("labels", {})))
    for name, doc in recipe.of_kind("MPIJob"):
        for replica, spec in doc["spec"]["mpiReplicaSpecs"].items():
            template = spec["template"]
            pods.append((f"{where(name, doc)} {replica}", template["spec"],
                         template.get("metadata", {}).get("labels", {})))
    return pods


def image_user(dockerfile):
    users = re.findall(r"^USER\s+(\d+)", dockerfile, re.M)
    return int(users[-1]) if users else None


def image_env(dockerfile):
    joined = re.sub(r"\\\n", " ", dockerfile)
    names = set()
    for line in re.findall(r"^ENV\s+(.*)$", joined, re.M):
        names.update(re.findall(r"(\w+)=", line))
    return names


def check_base_image(dockerfile):
    """hadolint does not follow an ARG into FROM: the base image's default is checked here."""
    match = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M)
    if match is None:
        return ["deploy/Dockerfile: no ARG BASE_IMAGE=<image> default"]
    image = match.group(1)
    if "@sha256:" not in image and not re.search(r":\d+\.\d+", image):
        return [f"deploy/Dockerfile: BASE_IMAGE defaults to {image}, not a point release "
                "(debian:12.N-slim) or a digest"]
    return []


def check_pods(recipe):
    """One image, resources, and the image's non-root user on every pod."""
    findings, images = check_base_image(recipe.dockerfile), set()
    uid = image_user(recipe.dockerfile)
    if uid is None or uid == 0:
        findings.append(f"deploy/Dockerfile: its last USER is {uid}, not a numeric non-root uid")
    for label, spec, _ in pod_specs(recipe):
        context = spec.get("securityContext", {})
        if context.get("runAsNonRoot") is not True or context.get("runAsUser") != uid:
            findings.append(f"{label}: securityContext needs runAsNonRoot: true and runAsUser: "
                            f"{uid} (the image's user)")
        for container in spec.get("containers", []):
            images.add(container.get("image"))
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                missing = {"cpu", "memory"} - set(resources.get(kind, {}))
                if missing:
                    findings.append(f"{label}: container {container.get('name')} has no "
                                    f"resources.{kind} for {', '.join(sorted(missing))}")
    if len(images) > 1:
        findings.append(f"the manifests name several images {sorted(images)}; the recipe "
                        "builds one")
    return findings


def _container(spec):
    return spec["containers"][0]


def _mounts(spec, container):
    """{mount path: (claim or None, subPath, read-only)} of a container."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        claim = volume.get("persistentVolumeClaim", {})
        mounts[mount["mountPath"].rstrip("/")] = (
            claim.get("claimName"), mount.get("subPath", ""),
            bool(mount.get("readOnly")) and bool(claim.get("readOnly", True)))
    return mounts


def _on_volume(path, mounts):
    """(claim, path inside the claim) of an absolute path, by its longest mount prefix."""
    for mount in sorted(mounts, key=len, reverse=True):
        if path == mount or path.startswith(mount + "/"):
            claim, sub, _ = mounts[mount]
            inner = "/".join(p for p in (sub, path[len(mount):].strip("/")) if p)
            return claim, inner
    return None, None


def _trainer_argv(args, label, findings):
    """The launcher's mpirun options and the trainer's arguments after `-m mxrec.streaming`."""
    for i in range(len(args) - 2):
        if args[i:i + 3] == ["-m", "mxrec.streaming", "train"]:
            return args[:i], args[i + 2:]
    findings.append(f"{label}: the launcher runs no `-m mxrec.streaming train`")
    return args, None


def _mpirun_exports(mpirun):
    return [mpirun[i + 1] for i, arg in enumerate(mpirun[:-1]) if arg == "-x"]


def check_trainer(recipe):
    """The MPIJob: shared volume, the trainer's paths on it, mpirun's hostfile and exports,
    thread pools within the worker's CPU limit, sshd where the operator puts its keys."""
    findings, exports = [], {}
    for name, doc in recipe.of_kind("MPIJob"):
        label, spec = where(name, doc), doc["spec"]
        replicas = spec["mpiReplicaSpecs"]
        launcher = replicas["Launcher"]["template"]["spec"]
        worker = replicas["Worker"]["template"]["spec"]
        container = _container(launcher)
        mpirun, train = _trainer_argv(container.get("args", []), label, findings)
        if mpirun[:3] != ["mpirun", "--hostfile", "/etc/mpi/hostfile"]:
            findings.append(f"{label}: the launcher must start `mpirun --hostfile "
                            "/etc/mpi/hostfile` (Open MPI 5 reads no OMPI_MCA_orte_* variable)")
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        for var in _mpirun_exports(mpirun):
            if var not in env and var not in image_env(recipe.dockerfile) | {"PATH"}:
                findings.append(f"{label}: mpirun -x {var}, which neither the launcher's env "
                                "nor the image's ENV sets")
        findings += _thread_budget(label, spec, env, _container(worker))
        findings += _ssh_layout(recipe, label, spec, worker)
        if train is None:
            continue
        args = parse_cli("mxrec/streaming/__main__.py", train, label, findings)
        if args is None:
            continue
        findings += _shared_paths(label, launcher, worker, args, exports)
    return findings, exports


def _cpu(value):
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _thread_budget(label, spec, env, worker_container):
    slots = int(spec.get("slotsPerWorker", 1))
    limit = _cpu(worker_container.get("resources", {}).get("limits", {}).get("cpu", 0))
    findings = []
    for var in ("TF_NUM_INTRAOP_THREADS", "KEY_PROCESS_THREAD_NUM"):
        if var not in env:
            findings.append(f"{label}: the launcher sets no {var}: each rank would size its "
                            "pool by the node's cores, not the worker's CPU limit")
        elif int(env[var]) * slots > limit:
            findings.append(f"{label}: {var}={env[var]} x slotsPerWorker {slots} exceeds the "
                            f"worker's CPU limit {limit:g}")
    return findings


def _ssh_layout(recipe, label, spec, worker):
    findings = []
    keys = re.search(r"^HostKey\s+(\S+)/id_rsa$", recipe.sshd_config, re.M)
    port = re.search(r"^Port\s+(\d+)$", recipe.sshd_config, re.M)
    if keys is None or spec.get("sshAuthMountPath") != keys.group(1):
        findings.append(f"{label}: sshAuthMountPath {spec.get('sshAuthMountPath')!r} is not the "
                        "folder deploy/image/sshd_config reads its keys from")
    container = _container(worker)
    if container.get("args") != ["worker"]:
        findings.append(f"{label}: the workers must run the image's `worker` role (sshd)")
    ports = [p.get("containerPort") for p in container.get("ports", [])]
    if port is None or int(port.group(1)) not in ports:
        findings.append(f"{label}: the worker's ports {ports} miss sshd's port")
    if "readinessProbe" not in container:
        findings.append(f"{label}: the worker has no readiness probe, so WaitForWorkersReady "
                        "could start mpirun before sshd listens")
    return findings


def _shared_paths(label, launcher, worker, args, exports):
    findings = []
    launcher_mounts = _mounts(launcher, _container(launcher))
    worker_mounts = _mounts(worker, _container(worker))
    for flag, path in (("--data", args.data), ("--model-dir", args.workdir),
                       ("--export-base", args.export_base)):
        if path is None:
            findings.append(f"{label}: the trainer has no {flag}")
            continue
        on_worker = _on_volume(path, worker_mounts)
        if on_worker[0] is None:
            findings.append(f"{label}: {flag} {path} is on no PersistentVolumeClaim the "
                            "workers mount: every rank must see it")
        elif _on_volume(path, launcher_mounts) != on_worker:
            findings.append(f"{label}: {flag} {path} is not the same volume path on the "
                            "launcher and the workers")
        if flag == "--export-base":
            exports[label] = on_worker
    return findings


def check_predictor(recipe, exports):
    """The Deployment's command line, port, probes and mounts, and its Service."""
    findings = []
    for name, doc in recipe.of_kind("Deployment"):
        label = where(name, doc)
        template = doc["spec"]["template"]
        container = _container(template["spec"])
        argv = container.get("args", [])
        if argv[:1] != ["serve"]:
            findings.append(f"{label}: the container must run the image's `serve` role")
            continue
        args = parse_cli("mxrec/serving/__main__.py", argv[1:], label, findings)
        if args is None:
            continue
        if args.host != "0.0.0.0":
            findings.append(f"{label}: --host {args.host}: only 0.0.0.0 takes the Service's "
                            "and the kubelet's connections")
        findings += _probes(label, container, args)
        findings += _export_mount(label, template["spec"], container, args, exports)
        findings += _services(recipe, label, template, container, args)
    return findings


def _port_of(container, port):
    """A probe's or Service's port (a number or a port name) as a number."""
    for entry in container.get("ports", []):
        if port in (entry.get("name"), entry.get("containerPort")):
            return entry.get("containerPort")
    return port if isinstance(port, int) else None


def _probes(label, container, args):
    findings = []
    path = f"/v1/models/{args.model_name}"
    ready = container.get("readinessProbe", {}).get("httpGet", {})
    if ready.get("path") != path or _port_of(container, ready.get("port")) != args.port:
        findings.append(f"{label}: readinessProbe must GET {path} on port {args.port} (the "
                        f"status endpoint), not {ready.get('path')} on {ready.get('port')}")
    for probe in ("livenessProbe", "startupProbe"):
        command = container.get(probe, {}).get("exec", {}).get("command", [])
        flags = dict(zip(command[2::2], command[3::2]))
        if (command[:2] != ["mxrec-healthcheck", "--live"]
                or flags.get("--port") != str(args.port)
                or flags.get("--model-name") != args.model_name):
            findings.append(f"{label}: {probe} must run `mxrec-healthcheck --live --port "
                            f"{args.port} --model-name {args.model_name}`, not {command}")
    return findings


def _export_mount(label, spec, container, args, exports):
    findings = []
    mounts = _mounts(spec, container)
    claim, inner = _on_volume(args.export_base.rstrip("/"), mounts)
    if claim is None:
        findings.append(f"{label}: --export-base {args.export_base} is on no "
                        "PersistentVolumeClaim")
        return findings
    mount = max((m for m in mounts if args.export_base.startswith(m)), key=len)
    if not mounts[mount][2]:
        findings.append(f"{label}: the export base's mount {mount} must be read-only (the "
                        "volumeMount and the claim): the predictor only reads it")
    if exports and (claim, inner) not in exports.values():
        findings.append(f"{label}: --export-base {args.export_base} is {claim}:{inner}, the "
                        f"trainer exports to {sorted(exports.values())}")
    return findings


def _services(recipe, label, template, container, args):
    findings = []
    labels = template["metadata"].get("labels", {})
    if _port_of(container, "http") != args.port:
        findings.append(f"{label}: the container port named http is not --port {args.port}")
    services = [(n, d) for n, d in recipe.of_kind("Service")
                if d["spec"].get("selector", {}).items() <= labels.items()]
    if not services:
        findings.append(f"{label}: no Service selects its pods")
    for name, doc in services:
        for port in doc["spec"].get("ports", []):
            if _port_of(container, port.get("targetPort", port.get("port"))) != args.port:
                findings.append(f"{where(name, doc)}: targetPort {port.get('targetPort')} is "
                                f"not the predictor's --port {args.port}")
    return findings


def check_claims(recipe):
    findings = []
    claims = {d["metadata"]["name"]: d for _, d in recipe.of_kind("PersistentVolumeClaim")}
    for label, spec, _ in pod_specs(recipe):
        for volume in spec.get("volumes", []):
            claim = volume.get("persistentVolumeClaim", {}).get("claimName")
            if claim is None:
                continue
            if claim not in claims:
                findings.append(f"{label}: claim {claim} is defined in no manifest")
            elif "ReadWriteMany" not in claims[claim]["spec"].get("accessModes", []):
                findings.append(f"PersistentVolumeClaim/{claim}: must be ReadWriteMany: pods "
                                "on several nodes mount it")
    return findings


def check_recipe(recipe):
    trainer, exports = check_trainer(recipe)
    return (check_pods(recipe) + trainer + check_predictor(recipe, exports)
            + check_claims(recipe))


# running them -------------------------------------------------------------------------------

CHECKS = {
    "hadolint": lambda recipe, version, schema: check_dockerfile(recipe),
    "kubernetes-validate": lambda recipe, version, schema: check_core_kinds(recipe, version),
    "MPIJob CRD schema": lambda recipe, version, schema: check_mpijobs(recipe, schema),
    "recipe": lambda recipe, version, schema: check_recipe(recipe),
}


def run_checks(recipe, version, schema, only=None):
    """{check name: [findings]} of every check, or of `only`."""
    return {name: check(recipe, version, schema) for name, check in CHECKS.items()
            if only in (None, name)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubernetes-version", default=KUBERNETES_VERSION)
    parser.add_argument("--self-test", action="store_true",
                        help="also plant one error per check and fail unless each is caught")
    args = parser.parse_args(argv)
    recipe, schema = Recipe.load(), mpijob_schema()
    results = run_checks(recipe, args.kubernetes_version, schema)
    failed = False
    for check, findings in results.items():
        print(f"{check}: {'ok' if not findings else f'{len(findings)} finding(s)'}")
        for finding in findings:
            print(f"  {finding}")
        failed |= bool(findings)
    if args.self_test:
        from planted import self_test  # noqa: PLC0415 (deploy/planted.py, beside this file)

        failed |= not self_test(recipe, args.kubernetes_version, schema, run_checks)
    return 1 if failed else 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
