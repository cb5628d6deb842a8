#!/usr/bin/python3
"""Check the example Kubernetes manifests (packaging/kubernetes/*.yaml, docs/scaling.md) offline.

Each document is read into the Kubernetes API's own model classes (Debian's python3-kubernetes, the
official client, which carries the API's schema: every field's name, type and whether it is required), and
the check is strict where the client is lenient: a field the schema does not have is an error (a typo such
as `readinessProbes` would otherwise be dropped silently), and scalars must have the schema's type. Then
what ties the documents together: a Deployment's selector matches its pod labels, a Service selects some
Deployment's pods and its named target port exists there, probes name ports the container has, and every
CAR_INFERENCE_* variable in a ConfigMap or env list is a setting the daemon knows (`car-inferenced --help`,
when --daemon is given). Exit 0 clean, 1 with every problem listed, 77 (skip) without python3-kubernetes.

  scripts/check-manifests.py [--daemon build/daemon/car-inferenced] FILE.yaml...
"""
import re
import subprocess
import sys

try:
    import yaml
    import kubernetes.client as k8s
    from kubernetes.client import ApiClient
except ImportError as e:  # a machine without the package: say so, and let ctest count it as skipped
    print(f"check-manifests: skipped: {e} (apt-get install python3-kubernetes python3-yaml)")
    sys.exit(77)

problems = []


def problem(where, what):
    problems.append(f"{where}: {what}")


def model_class(api_version, kind):
    version = api_version.split("/")[-1]
    name = version[0].upper() + version[1:] + kind
    return getattr(k8s, name, None)


SCALARS = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def strict(value, type_name, where):
    """Every key of `value` a field of `type_name` (recursively), every scalar of its type."""
    if value is None:
        return
    m = re.fullmatch(r"list\[(.+)\]", type_name)
    if m:
        if not isinstance(value, list):
            return problem(where, f"expected a list, got {type(value).__name__}")
        for i, item in enumerate(value):
            strict(item, m.group(1), f"{where}[{i}]")
        return
    m = re.fullmatch(r"dict\((\w+), (.+)\)", type_name)
    if m:
        if not isinstance(value, dict):
            return problem(where, f"expected a mapping, got {type(value).__name__}")
        for k, v in value.items():
            strict(v, m.group(2), f"{where}.{k}")
        return
    if type_name in SCALARS:
        # bool is an int in Python: keep them apart.
        ok = isinstance(value, SCALARS[type_name]) and not (type_name != "bool" and isinstance(value, bool))
        if not ok:
            problem(where, f"expected {type_name}, got {type(value).__name__} {value!r}")
        return
    if type_name in ("object", "datetime", "date"):
        return
    cls = getattr(k8s, type_name, None)
    if cls is None:
        return problem(where, f"unknown schema type {type_name}")
    if not isinstance(value, dict):
        return problem(where, f"expected a {type_name} mapping, got {type(value).__name__}")
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, v in value.items():
        if key not in by_json:
            problem(f"{where}.{key}", f"not a field of {type_name}")
            continue
        strict(v, cls.openapi_types[by_json[key]], f"{where}.{key}")


def known_settings(daemon):
    out = subprocess.run([daemon, "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"\((CAR_INFERENCE_[A-Z0-9_]+)\)", out))


def main(argv):
    daemon = None
    files = []
    args = iter(argv)
    for a in args:
        if a == "--daemon":
            daemon = next(args)
        else:
            files.append(a)
    if not files:
        print(__doc__)
        return 2
    settings = known_settings(daemon) if daemon else None
    client = ApiClient()
    docs = []
    for f in files:
        with open(f) as fh:
            for i, doc in enumerate(yaml.safe_load_all(fh)):
                if doc is None:
                    continue
                where = f"{f}#{i + 1} {doc.get('kind', '?')}/{doc.get('metadata', {}).get('name', '?')}"
                cls = model_class(doc.get("apiVersion", ""), doc.get("kind", ""))
                if cls is None:
                    problem(where, f"no schema for {doc.get('apiVersion')} {doc.get('kind')}")
                    continue
                before = len(problems)
                strict(doc, cls.__name__, where)
                try:  # required fields and enum values, as the client's own validation sees them
                    client._ApiClient__deserialize(doc, cls.__name__)
                except (ValueError, TypeError) as e:
                    problem(where, str(e))
                if len(problems) == before:  # the cross-checks below read only well-formed documents
                    docs.append((where, doc))

    deployments = [(w, d) for w, d in docs if d["kind"] == "Deployment"]
    pod_labels = []
    for where, d in deployments:
        spec = d.get("spec", {})
        labels = spec.get("template", {}).get("metadata", {}).get("labels", {}) or {}
        match = (spec.get("selector") or {}).get("matchLabels", {}) or {}
        if any(labels.get(k) != v for k, v in match.items()):
            problem(where, f"selector {match} does not match the pod labels {labels}")
        containers = spec.get("template", {}).get("spec", {}).get("containers", []) or []
        ports = {p.get("name") for c in containers for p in c.get("ports", []) or [] if p.get("name")}
        pod_labels.append((labels, ports))
        for c in containers:
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
                if isinstance(port, str) and port not in ports:
                    problem(where, f"{c.get('name')}.{probe} names port {port!r}, not one of {sorted(ports)}")
            for e in c.get("env", []) or []:
                name = e.get("name", "")
                if settings is not None and name.startswith("CAR_INFERENCE_") and name not in settings:
                    problem(where, f"{name} is not a car-inferenced setting")
    for where, d in docs:
        if d["kind"] == "Service":
            sel = d.get("spec", {}).get("selector", {}) or {}
            hits = [ports for labels, ports in pod_labels if all(labels.get(k) == v for k, v in sel.items())]
            if not hits:
                # A Service for pods defined elsewhere (another group) is fine only if no Deployment here
                # claims its name's pods; report it so the example stays self-consistent.
                problem(where, f"selector {sel} selects no Deployment's pods in these files")
            for p in d.get("spec", {}).get("ports", []) or []:
                t = p.get("targetPort")
                if isinstance(t, str) and hits and not any(t in ports for ports in hits):
                    problem(where, f"targetPort {t!r} is not a port of the selected pods")
        if d["kind"] == "ConfigMap" and settings is not None:
            for key in (d.get("data") or {}):
                if key.startswith("CAR_INFERENCE_") and key not in settings:
                    problem(where, f"{key} is not a car-inferenced setting")
    for p in problems:
        print(f"check-manifests: {p}")
    print(f"check-manifests: {len(files)} files, {len(docs)} well-formed documents, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
