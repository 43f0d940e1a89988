#!/usr/bin/env python3
"""Offline checks of the deployment kit in deploy/ (no container runtime, no cluster):

a. the Kubernetes core objects in deploy/k8s/*.yaml validate against the Kubernetes OpenAPI
   schemas (kubernetes-validate, strict: unknown fields are errors);
b. the custom resources (InferencePool, inference.networking.k8s.io/v1; HTTPRoute) have the fields
   the v1 API requires, and point at the Deployment's pods and at each other;
c. the manifests agree with themselves and with the server: probes on /health at the container
   port, that port in --port and the Service, a preStop hook, a grace period longer than preStop
   plus --shutdown-timeout, the image's non-root uid, the cache folder on a writable volume;
d. deploy/Dockerfile passes small lint checks and agrees with the manifests, scripts/test.sh's
   cmake flags and the shared libraries the vlm binary needs;
e. the container's start command (ENTRYPOINT + CMD) runs: with the binary from --vlm and the
   shipped tiny model it answers /health (also through the image's HEALTHCHECK command) and a chat
   completion, exports the vllm:* metrics the endpoint picker reads, and exits 0 on SIGTERM.

Run: python tests/deploy/deploy_test.py --vlm PATH_TO_VLM [unittest options]
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy/Dockerfile"
K8S_DIR = REPO / "deploy/k8s"
TINY_MODEL = REPO / "models/tiny-qwen35"  # the default model
MODEL_PATH = "/models/model"  # where the image expects the checkpoint
POOL_API = "inference.networking.k8s.io/v1"
ROUTE_API = "gateway.networking.k8s.io/v1"
# API groups of custom resources: no schema ships with Kubernetes (part b checks them).
CUSTOM_GROUPS = {"inference.networking.k8s.io", "gateway.networking.k8s.io"}
# The metrics the Inference Extension's endpoint picker reads (its model server protocol).
EPP_METRICS = ["vllm:num_requests_waiting", "vllm:num_requests_running",
               "vllm:kv_cache_usage_perc", "vllm:cache_config_info"]
START_TIMEOUT = 20.0

ARGS = argparse.Namespace(vlm=None)


# ---- reading the files -----------------------------------------------------------------------

def load_manifests():
    """[(file name, object)] of every YAML document in deploy/k8s/*.yaml."""
    out = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                out.append((path.name, obj))
    return out


def dockerfile_stages(text):
    """The Dockerfile as stages, each a list of (INSTRUCTION, arguments): continuation lines joined,
    comments dropped (also those inside a continued instruction, as Docker does)."""
    stages, buf = [], ""
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#") or (not s and not buf):
            continue
        if s.endswith("\\"):
            buf += s[:-1].rstrip() + " "
            continue
        buf += s
        parts = buf.split(None, 1)
        instr, rest = parts[0].upper(), (parts[1].strip() if len(parts) > 1 else "")
        buf = ""
        if instr == "FROM":
            stages.append([])
        if not stages:
            if instr == "ARG":
                continue  # an ARG before the first FROM
            raise AssertionError(f"Dockerfile: {instr} before the first FROM")
        stages[-1].append((instr, rest))
    return stages


def exec_form(rest, what):
    """The JSON (exec) form of CMD/ENTRYPOINT/HEALTHCHECK CMD as a list."""
    if not rest.startswith("["):
        raise AssertionError(f"{what} is in shell form ({rest!r}): the exec form keeps vlm PID 1, "
                             "so that it receives SIGTERM itself")
    value = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return value


def flag(args, *names):
    """The value of the last of `names` in an argument list (`--f v` or `--f=v`); None if absent."""
    value = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(n + "=") and n.startswith("--"):
                value = a[len(n) + 1:]
    return value


class Kit:
    """The parsed files, shared by the tests."""

    def __init__(self):
        self.manifests = load_manifests()
        self.stages = dockerfile_stages(DOCKERFILE.read_text())

    def objects(self, kind, api_version=None):
        return [o for _, o in self.manifests
                if o.get("kind") == kind and (api_version is None or o.get("apiVersion") == api_version)]

    def one(self, kind, api_version=None):
        found = self.objects(kind, api_version)
        if len(found) != 1:
            raise AssertionError(f"deploy/k8s: {len(found)} objects of kind {kind}, expected 1")
        return found[0]

    # Kubernetes side
    @property
    def deployment(self):
        return self.one("Deployment", "apps/v1")

    @property
    def pod(self):
        return self.deployment["spec"]["template"]["spec"]

    @property
    def container(self):
        containers = self.pod["containers"]
        named = [c for c in containers if c.get("name") == "vlm"]
        return named[0] if named else containers[0]

    @property
    def k8s_args(self):
        return [str(a) for a in self.container.get("args", [])]

    def container_port(self, ref=None):
        """The container's port number; `ref` (a number or a port name) resolved against it."""
        ports = self.container.get("ports", [])
        if ref is None:
            assert len(ports) >= 1, "the container declares no port"
            return int(ports[0]["containerPort"])
        if isinstance(ref, int):
            return ref
        if str(ref).isdigit():
            return int(ref)
        named = [p for p in ports if p.get("name") == ref]
        assert named, f"port name {ref!r} is not a container port"
        return int(named[0]["containerPort"])

    # Docker side
    @property
    def runtime(self):
        return self.stages[-1]

    def last(self, instr, stage=None):
        found = [rest for i, rest in (stage or self.runtime) if i == instr]
        return found[-1] if found else None

    @property
    def docker_command(self):
        """ENTRYPOINT + CMD of the final image, as the container runs them."""
        entry = self.last("ENTRYPOINT")
        cmd = self.last("CMD")
        return ((exec_form(entry, "ENTRYPOINT") if entry else [])
                + (exec_form(cmd, "CMD") if cmd else []))

    @property
    def docker_args(self):
        """The command's arguments after the binary (what the Deployment's args replace)."""
        entry = self.last("ENTRYPOINT")
        if entry:
            return exec_form(self.last("CMD") or "[]", "CMD")
        return self.docker_command[1:]

    @property
    def docker_uid(self):
        user = self.last("USER")
        assert user, "no USER after the last FROM: the server would run as root"
        uid = user.split(":")[0]
        assert uid.isdigit(), (f"USER {user}: give a numeric uid, so that runAsNonRoot can verify "
                               "it without reading /etc/passwd")
        return int(uid)

    @property
    def docker_env(self):
        env = {}
        for instr, rest in self.runtime:
            if instr == "ENV":
                for item in shlex.split(rest):
                    k, sep, v = item.partition("=")
                    assert sep, f"ENV {rest}: use the KEY=VALUE form"
                    env[k] = v
        return env

    @property
    def healthcheck(self):
        """(options, command list) of the final image's HEALTHCHECK."""
        rest = self.last("HEALTHCHECK")
        assert rest, "no HEALTHCHECK in the final image"
        m = re.match(r"^((?:--\S+\s+)*)CMD\s+(.*)$", rest, re.S)
        assert m, f"HEALTHCHECK {rest!r}: expected [OPTIONS] CMD [...]"
        return m.group(1).split(), exec_form(m.group(2), "HEALTHCHECK CMD")


KIT = None


def kit():
    global KIT
    if KIT is None:
        KIT = Kit()
    return KIT


# ---- a. schemas ------------------------------------------------------------------------------

class SchemaTest(unittest.TestCase):
    """Kubernetes core objects against kubernetes-validate's schemas (strict)."""

    def test_core_objects_validate(self):
        version = kubernetes_validate.latest_version()
        validated = []
        for name, obj in kit().manifests:
            group = obj.get("apiVersion", "").rpartition("/")[0]
            with self.subTest(file=name, kind=obj.get("kind"), name=obj.get("metadata", {}).get("name")):
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                    validated.append(obj["kind"])
                except kubernetes_validate.SchemaNotFoundError:
                    if group not in CUSTOM_GROUPS:
                        self.fail(f"{obj.get('apiVersion')} {obj.get('kind')}: no schema in "
                                  f"Kubernetes {version}")
                    # a custom resource: checked in CustomResourceTest
                except kubernetes_validate.ValidationError as e:
                    path = ".".join(str(p) for p in e.path)
                    self.fail(f"{name}: {obj['kind']} does not validate against Kubernetes "
                              f"{e.version}: {path}: {e.message}")
        print(f"\n  kubernetes-validate {kubernetes_validate.__version__}, Kubernetes {version}: "
              f"{', '.join(validated)} valid", file=sys.stderr)
        for kind in ("Deployment", "Service", "PersistentVolumeClaim"):
            self.assertIn(kind, validated)

    def test_validator_rejects_an_unknown_field(self):
        # The control: strict mode must catch a misspelt field (else the test above proves little).
        bad = json.loads(json.dumps(kit().deployment))
        bad["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, kubernetes_validate.latest_version(), strict=True)


# ---- b. custom resources ---------------------------------------------------------------------

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class CustomResourceTest(unittest.TestCase):
    """InferencePool and HTTPRoute against the fields of the v1 APIs (no schema offline)."""

    def assert_keys(self, obj, allowed, where):
        unknown = set(obj) - set(allowed)
        self.assertFalse(unknown, f"{where}: fields the API does not define: {sorted(unknown)}")

    def test_inference_pool(self):
        k = kit()
        pool = k.one("InferencePool")
        self.assertEqual(pool["apiVersion"], POOL_API)
        self.assert_keys(pool, {"apiVersion", "kind", "metadata", "spec"}, "InferencePool")
        name = pool.get("metadata", {}).get("name", "")
        self.assertRegex(name, DNS_SUBDOMAIN)
        spec = pool["spec"]
        self.assert_keys(spec, {"selector", "targetPorts", "appProtocol", "endpointPickerRef"},
                         "InferencePool.spec")
        # selector: matchLabels only, 1 to 64 labels, the Deployment's pod labels.
        self.assert_keys(spec["selector"], {"matchLabels"}, "spec.selector")
        labels = spec["selector"]["matchLabels"]
        self.assertIsInstance(labels, dict)
        self.assertTrue(1 <= len(labels) <= 64, labels)
        self.assertEqual(labels, k.deployment["spec"]["template"]["metadata"]["labels"])
        # targetPorts: 1 to 8, unique, the first is the container's port.
        ports = spec["targetPorts"]
        self.assertTrue(1 <= len(ports) <= 8, ports)
        numbers = []
        for p in ports:
            self.assert_keys(p, {"number"}, "spec.targetPorts[]")
            self.assertIsInstance(p["number"], int)
            self.assertTrue(1 <= p["number"] <= 65535, p)
            numbers.append(p["number"])
        self.assertEqual(len(numbers), len(set(numbers)), "target port numbers must be unique")
        self.assertEqual(numbers[0], k.container_port())
        if "appProtocol" in spec:
            self.assertIn(spec["appProtocol"], ("http", "kubernetes.io/h2c"))
        # endpointPickerRef: optional in the API since v1.5.0 but required by most gateways; the
        # port is required for a Service (the default kind).
        ref = spec.get("endpointPickerRef")
        self.assertIsNotNone(ref, "endpointPickerRef: most gateway implementations require it")
        self.assert_keys(ref, {"group", "kind", "name", "port", "failureMode"},
                         "spec.endpointPickerRef")
        self.assertRegex(ref.get("name", ""), DNS_SUBDOMAIN)
        if ref.get("kind", "Service") == "Service":
            self.assertEqual(ref.get("group", ""), "")
            self.assertIn("port", ref, "endpointPickerRef.port is required when kind is Service")
        if "port" in ref:
            self.assert_keys(ref["port"], {"number"}, "endpointPickerRef.port")
            self.assertTrue(1 <= ref["port"]["number"] <= 65535, ref)
        self.assertIn(ref.get("failureMode", "FailClose"), ("FailOpen", "FailClose"))

    def test_http_route(self):
        k = kit()
        pool = k.one("InferencePool")
        route = k.one("HTTPRoute")
        self.assertEqual(route["apiVersion"], ROUTE_API)
        self.assertRegex(route.get("metadata", {}).get("name", ""), DNS_SUBDOMAIN)
        parents = route["spec"]["parentRefs"]
        self.assertTrue(parents, "the HTTPRoute has no parentRefs")
        for p in parents:
            self.assertTrue(p.get("name"))
            self.assertEqual(p.get("group", "gateway.networking.k8s.io"), "gateway.networking.k8s.io")
            self.assertEqual(p.get("kind", "Gateway"), "Gateway")
        refs = [b for rule in route["spec"]["rules"] for b in rule.get("backendRefs", [])]
        to_pool = [b for b in refs
                   if b.get("group") == "inference.networking.k8s.io" and b.get("kind") == "InferencePool"]
        self.assertTrue(to_pool, f"no backendRef of group inference.networking.k8s.io, kind "
                                 f"InferencePool: {refs}")
        for b in to_pool:
            self.assertEqual(b.get("name"), pool["metadata"]["name"])
            self.assertEqual(b.get("namespace", pool["metadata"].get("namespace")),
                             pool["metadata"].get("namespace"))


# ---- c. consistency --------------------------------------------------------------------------

def sleep_seconds(pre_stop):
    """The seconds a preStop hook waits (exec `sleep N` or the sleep action); 0 otherwise."""
    if "sleep" in pre_stop:
        return float(pre_stop["sleep"]["seconds"])
    cmd = pre_stop.get("exec", {}).get("command", [])
    if len(cmd) == 2 and Path(cmd[0]).name == "sleep":
        return float(cmd[1])
    m = re.search(r"\bsleep\s+(\d+(?:\.\d+)?)", " ".join(cmd))
    return float(m.group(1)) if m else 0.0


class ConsistencyTest(unittest.TestCase):
    """The manifests against each other, the server's flags and the Dockerfile."""

    def test_ports(self):
        k = kit()
        port = k.container_port()
        self.assertEqual(int(flag(k.k8s_args, "--port")), port, "--port != containerPort")
        svc = k.one("Service")
        self.assertEqual(svc["spec"]["selector"], k.deployment["spec"]["template"]["metadata"]["labels"])
        svc_ports = svc["spec"]["ports"]
        self.assertEqual(len(svc_ports), 1)
        self.assertEqual(k.container_port(svc_ports[0].get("targetPort", svc_ports[0]["port"])), port)
        self.assertEqual(k.deployment["spec"]["selector"]["matchLabels"],
                         k.deployment["spec"]["template"]["metadata"]["labels"])

    def test_probes_hit_health(self):
        k = kit()
        c = k.container
        for probe in ("readinessProbe", "livenessProbe"):
            with self.subTest(probe=probe):
                self.assertIn(probe, c)
                get = c[probe].get("httpGet")
                self.assertIsNotNone(get, f"{probe} is not an httpGet")
                self.assertEqual(get["path"], "/health")
                self.assertEqual(k.container_port(get["port"]), k.container_port())
        if "startupProbe" in c:
            self.assertEqual(c["startupProbe"]["httpGet"]["path"], "/health")
            self.assertEqual(k.container_port(c["startupProbe"]["httpGet"]["port"]), k.container_port())
        else:  # without a startup probe, liveness must wait out the model load
            self.assertGreaterEqual(c["livenessProbe"].get("initialDelaySeconds", 0), 30)
        # Liveness tolerates failures longer than readiness does (a drain or a stall takes the pod
        # out of the endpoints long before it is restarted).
        window = lambda p: p.get("periodSeconds", 10) * p.get("failureThreshold", 3)
        self.assertGreater(window(c["livenessProbe"]), window(c["readinessProbe"]))

    def test_shutdown(self):
        k = kit()
        pre_stop = k.container.get("lifecycle", {}).get("preStop")
        self.assertTrue(pre_stop, "no preStop hook: endpoints would still send requests to a "
                                  "draining pod")
        timeout = flag(k.k8s_args, "--shutdown-timeout")
        self.assertIsNotNone(timeout, "pass --shutdown-timeout explicitly, so that the grace period "
                                      "can be checked against it")
        grace = k.pod.get("terminationGracePeriodSeconds", 30)
        self.assertGreater(grace, sleep_seconds(pre_stop) + float(timeout),
                           "terminationGracePeriodSeconds must cover preStop and the drain")

    def test_security_context(self):
        k = kit()
        pod_sc = k.pod.get("securityContext", {})
        sc = {**pod_sc, **k.container.get("securityContext", {})}  # the container's wins
        self.assertIs(sc.get("runAsNonRoot"), True)
        self.assertEqual(sc.get("runAsUser"), k.docker_uid)
        self.assertIs(sc.get("readOnlyRootFilesystem"), True)
        self.assertIs(sc.get("allowPrivilegeEscalation"), False)

    def test_volumes(self):
        k = kit()
        volumes = {v["name"]: v for v in k.pod.get("volumes", [])}
        mounts = k.container.get("volumeMounts", [])

        def mount_of(path):
            best = None
            for m in mounts:
                mp = m["mountPath"].rstrip("/")
                if (path == mp or path.startswith(mp + "/")) and (
                        best is None or len(mp) > len(best["mountPath"].rstrip("/"))):
                    best = m
            return best

        # The model: under a read-only mount of the PVC that the manifests define.
        model = flag(k.k8s_args, "-m", "--model")
        self.assertEqual(model, MODEL_PATH)
        m = mount_of(model)
        self.assertIsNotNone(m, f"{model} is on no volume")
        self.assertIs(m.get("readOnly"), True)
        claim = volumes[m["name"]].get("persistentVolumeClaim", {}).get("claimName")
        self.assertIsNotNone(claim, "the model volume is not a PersistentVolumeClaim")
        self.assertIn(claim, [o["metadata"]["name"] for o in k.objects("PersistentVolumeClaim")])
        # The cache: VLM_CACHE_DIR as in the image, on a writable emptyDir (the root is read-only).
        env = {e["name"]: e for e in k.container.get("env", [])}
        self.assertIn("VLM_CACHE_DIR", env)
        cache = env["VLM_CACHE_DIR"]["value"]
        self.assertEqual(cache, k.docker_env.get("VLM_CACHE_DIR"))
        m = mount_of(cache)
        self.assertIsNotNone(m, f"VLM_CACHE_DIR {cache} is on no volume")
        self.assertFalse(m.get("readOnly", False))
        self.assertIn("emptyDir", volumes[m["name"]])

    def test_arg_variables_are_defined(self):
        # Kubernetes leaves $(NAME) as it is when NAME is not in env: vlm would get the text.
        k = kit()
        names = {e["name"] for e in k.container.get("env", [])}
        for a in k.k8s_args:
            for ref in re.findall(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                self.assertIn(ref, names, f"args use $({ref}), which env does not define")


# ---- d. the Dockerfile -----------------------------------------------------------------------

def needed_libraries(binary):
    """{soname: path} of the libraries the ELF file names as NEEDED; None without readelf/ldd."""
    if not shutil.which("readelf") or not shutil.which("ldd"):
        return None
    dyn = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True, check=True).stdout
    names = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    paths = dict(re.findall(r"^\s*(\S+) => (/\S+)", ldd, re.M))
    for path in re.findall(r"^\s*(/\S+) \(", ldd, re.M):  # the loader: no "=>"
        paths.setdefault(Path(path).name, path)
    return {n: paths.get(n) for n in names}


def debian_package(path):
    """The Debian package that ships a file (dpkg -S; merged-/usr aware); None if unknown."""
    candidates = [path, os.path.realpath(path)]
    if path.startswith("/lib"):
        candidates.append("/usr" + path)
    for c in candidates:
        r = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split(":", 1)[0].strip()
    return None


class DockerfileTest(unittest.TestCase):
    """Lint checks (no hadolint, no docker here) and agreement with the manifests."""

    def test_base_images(self):
        for stage in kit().stages:
            self.assertRegex(stage[0][1], r"^debian:bookworm(-slim)?(@sha256:[0-9a-f]{64})?(\s+AS\s+\S+)?$")

    def test_user(self):
        self.assertNotEqual(kit().docker_uid, 0)

    def test_expose_and_stopsignal(self):
        k = kit()
        self.assertEqual([p.split("/")[0] for p in (k.last("EXPOSE") or "").split()],
                         [str(k.container_port())])
        self.assertEqual(k.last("STOPSIGNAL"), "SIGTERM")

    def test_healthcheck(self):
        options, cmd = kit().healthcheck
        self.assertIn("/health", " ".join(cmd))
        port = str(kit().container_port())
        self.assertRegex(" ".join(cmd), rf"(/dev/tcp/[^/\s]+/|:){port}\b")
        opts = dict(o.split("=", 1) for o in options)
        self.assertIn("--start-period", opts, "without a start period a long model load reads as "
                                              "unhealthy")

    def test_command_matches_deployment(self):
        k = kit()
        cmd = k.docker_command
        self.assertEqual(Path(cmd[0]).name, "vlm")
        docker_args, k8s_args = k.docker_args, k.k8s_args
        self.assertEqual(docker_args[0], "serve")
        self.assertEqual(k8s_args[0], "serve")
        self.assertNotIn("command", k.container, "a command would replace the image's ENTRYPOINT")
        for names in (("-m", "--model"), ("--host",), ("--port",)):
            with self.subTest(flag=names[0]):
                self.assertIsNotNone(flag(docker_args, *names))
                self.assertEqual(flag(docker_args, *names), flag(k8s_args, *names))
        self.assertEqual(flag(docker_args, "-m", "--model"), MODEL_PATH)
        self.assertEqual(flag(docker_args, "--host"), "0.0.0.0")
        self.assertEqual(flag(docker_args, "--port"), str(k.container_port()))
        volumes = [v for rest in [r for i, r in k.runtime if i == "VOLUME"]
                   for v in (json.loads(rest) if rest.startswith("[") else rest.split())]
        self.assertIn(MODEL_PATH, volumes)

    def test_build_stage(self):
        k = kit()
        self.assertGreaterEqual(len(k.stages), 2, "expected a build stage and a runtime stage")
        runs = " ".join(rest for stage in k.stages[:-1] for i, rest in stage if i == "RUN")
        self.assertIn("scripts/install-deps.sh", runs)
        # scripts/test.sh's configure flags (bar the test venv), and only the vlm target.
        test_sh = (REPO / "scripts/test.sh").read_text().replace("\\\n", " ")
        configure = re.search(r"^cmake -S .*$", test_sh, re.M).group(0)
        wanted = [f for f in shlex.split(configure)
                  if (f.startswith("-D") or f.startswith("-G")) and "VLM_TEST_PYTHON" not in f]
        wanted.append("Ninja")
        tokens = shlex.split(runs.replace("&&", " && "))
        for f in wanted:
            self.assertIn(f, tokens, f"the build stage's cmake lacks scripts/test.sh's {f}")
        self.assertRegex(runs, r"cmake --build \S+ --target vlm\b")
        copies = [r for i, r in k.runtime if i == "COPY" and r.startswith("--from=")]
        self.assertTrue(any(r.split()[-1] == k.docker_command[0] for r in copies),
                        f"the runtime stage does not COPY --from the build stage to {k.docker_command[0]}")

    def test_runtime_packages_match_the_binary(self):
        # The runtime stage installs the Debian packages of exactly the libraries vlm links (the
        # CUDA libraries aside: the image is the CPU build), plus ca-certificates.
        k = kit()
        installs = [rest for i, rest in k.runtime if i == "RUN" and "apt-get install" in rest]
        self.assertEqual(len(installs), 1)
        tokens = shlex.split(installs[0].replace("&&", " && "))
        start = tokens.index("install") + 1
        pkgs = set()
        for t in tokens[start:]:
            if t in ("&&", "||", ";"):
                break
            if not t.startswith("-"):
                pkgs.add(t)
        libs = needed_libraries(ARGS.vlm)
        if libs is None or not shutil.which("dpkg"):
            self.skipTest("readelf, ldd or dpkg is missing")
        wanted = set()
        for soname, path in libs.items():
            if re.match(r"lib(cuda|cublas|cudart|nv)", soname):  # not libcurl
                continue
            self.assertIsNotNone(path, f"ldd does not resolve {soname}")
            pkg = debian_package(path)
            if pkg is None:
                self.skipTest(f"dpkg does not know {path} (not a Debian system?)")
            wanted.add(pkg)
        wanted.discard("libc6")  # in every Debian image
        self.assertFalse(wanted - pkgs, f"the runtime stage lacks packages: {sorted(wanted - pkgs)}")
        self.assertFalse(pkgs - wanted - {"ca-certificates"},
                         f"packages vlm does not need: {sorted(pkgs - wanted - {'ca-certificates'})}")


# ---- e. the start command --------------------------------------------------------------------

def http(url, body=None, timeout=10.0):
    """(status, text) of a GET, or of a POST of `body` as JSON."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


class StartCommandTest(unittest.TestCase):
    """The image's ENTRYPOINT + CMD, with --vlm for the binary and the tiny model for /models/model."""

    def test_serve_health_chat_drain(self):
        k = kit()
        cmd = list(k.docker_command)
        cmd[0] = ARGS.vlm
        cmd = [str(TINY_MODEL) if a == MODEL_PATH else a for a in cmd]
        i = cmd.index("--port")
        cmd[i + 1] = "0"  # any free port; vlm prints the one it took
        cmd += ["-t", "2"]  # as the other server tests: ctest runs tests side by side
        tmp = Path(tempfile.mkdtemp(prefix="vlm-deploy-test-"))
        self.addCleanup(shutil.rmtree, tmp, True)
        env = dict(os.environ)
        for key, value in k.docker_env.items():
            env[key] = str(tmp / "cache") if key == "VLM_CACHE_DIR" else value
        log_path = tmp / "serve.log"
        log = open(log_path, "wb")
        self.addCleanup(log.close)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)

        def cleanup():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.addCleanup(cleanup)
        output = lambda: log_path.read_text(errors="replace")[-4000:]

        deadline = time.monotonic() + START_TIMEOUT
        port = None
        while port is None:
            m = re.search(r"serving on http://[^\s]+:(\d+)", log_path.read_text(errors="replace"))
            if m:
                port = int(m.group(1))
            elif proc.poll() is not None or time.monotonic() > deadline:
                self.fail(f"{shlex.join(cmd)} did not start:\n{output()}")
            else:
                time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        while True:
            try:
                if http(base + "/health", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                self.fail(f"/health never answered 200:\n{output()}")
            time.sleep(0.05)

        # The image's HEALTHCHECK command, pointed at this port.
        _, check = k.healthcheck
        check = [re.sub(rf"\b{k.container_port()}\b", str(port), a) for a in check]
        if shutil.which(check[0]):
            r = subprocess.run(check, capture_output=True, text=True, timeout=10)
            self.assertEqual(r.returncode, 0, f"HEALTHCHECK failed on a healthy server: {r.stderr}")

        status, text = http(base + "/v1/models")
        self.assertEqual(status, 200, text)
        model = json.loads(text)["data"][0]["id"]
        status, text = http(base + "/v1/chat/completions", {
            "model": model, "max_tokens": 32,
            "messages": [{"role": "user", "content": "Describe the image."}]}, timeout=30)
        self.assertEqual(status, 200, text)
        content = json.loads(text)["choices"][0]["message"]["content"]
        self.assertTrue(content and content.strip(), text)

        status, metrics = http(base + "/metrics")
        self.assertEqual(status, 200)
        for name in EPP_METRICS:
            self.assertRegex(metrics, rf"(?m)^{re.escape(name)}[{{ ]", f"/metrics lacks {name}")

        # SIGTERM (the image's STOPSIGNAL) drains and exits 0 within --shutdown-timeout.
        drain = float(flag(k.k8s_args, "--shutdown-timeout") or 30)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=drain + 5)
        except subprocess.TimeoutExpired:
            self.fail(f"still running {drain + 5:.0f} s after SIGTERM:\n{output()}")
        self.assertEqual(rc, 0, f"exit status {rc} after SIGTERM:\n{output()}")
        self.assertLess(time.monotonic() - t0, drain)
        if shutil.which(check[0]):  # and the health check fails once the server is gone
            r = subprocess.run(check, capture_output=True, text=True, timeout=10)
            self.assertNotEqual(r.returncode, 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vlm", required=True, help="the vlm binary")
    args, rest = ap.parse_known_args()
    ARGS.vlm = str(Path(args.vlm).resolve())
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
