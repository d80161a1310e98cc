#!/usr/bin/python3
"""The container image as built artefact: build it, start a cluster from it, serve requests.

1. scripts/image/build.sh builds the CPU image from this build's binaries (mmdebstrap rootfs of
   the Dockerfile's RUNTIME_PKGS, umoci OCI image; its verify.sh checks the config against the
   Dockerfile, the library closure inside the image and the package list).
2. Router + 1 prefill + 1 decode start from the image's filesystem as umoci unpacked it, each
   with scripts/image/run-in-rootfs.sh (own mount namespace, chroot, the image's user from the
   runtime-spec config.json): podman cannot run in the development container (crun's setrlimit
   needs CAP_SYS_RESOURCE), so this is the closest to a container that works there. The checkpoint
   is written by the image's own k3pd-mkckpt, as the cpu-demo overlay's init container does.
   The cluster is the e2e harness's (tests/e2e/k3cluster.py: mutual TLS from a development CA).
3. A chat request (tokenizer in the router) and a token-id request are served; the token ids
   equal the monolithic k3pd-generate of the host build on the same checkpoint.
4. Each process's executable, root and every mapped shared library are files of the image
   (/proc/PID/{exe,root,maps}), and it runs as uid 10001.
5. /metrics of the three is scraped; tests/deploy/check_dashboard.py checks the Grafana
   dashboard's queries against what these processes serve. SIGTERM stops every process with 0.
Exit 77 (ctest SKIP) only when not root (chroot, mounts) or no Debian mirror can be reached.
Usage: test_image.py --bindir BUILD --gen PYSTUBS --workdir DIR [--extra-pkgs "PKG ..."]
                     [--image-dir OUT]   (skip step 1: use build.sh --out OUT's image, built
                                          from the same --bindir; for iterating on steps 2-5)
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from k3cluster import Cluster, load_stubs  # noqa: E402

WORKER_ARGS = ["--backend", "cpu-fast", "--threads", "1", "--precision", "fp32", "--page-tokens", "16"]
METRICS = ["--metrics-port", "0", "--metrics-host", "127.0.0.1"]
BINS = {"router": "k3pd-router", "prefill_worker": "k3pd-prefill", "decode_worker": "k3pd-decode",
        "tools/mkckpt": "k3pd-mkckpt"}


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok -", what, flush=True)


def build_image(args, out):
    cmd = ["bash", os.path.join(ROOT, "scripts", "image", "build.sh"), "--build-dir", args.bindir, "--out", out]
    if args.extra_pkgs:
        cmd += ["--extra-pkgs", args.extra_pkgs]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    print(p.stdout[-6000:], p.stderr[-4000:], sep="\n", flush=True)
    if p.returncode == 77:
        print("SKIP: %s" % p.stderr.strip().splitlines()[-1])
        sys.exit(77)
    check(p.returncode == 0, "scripts/image/build.sh built and verified the image (%.0f s)" % (time.time() - t0))
    tars = [f for f in os.listdir(out) if f.endswith(".oci.tar")]
    check(len(tars) == 1, "one oci-archive written: %s" % tars)


def wrappers(bundle, run, bindir):
    """A bindir laid out like a build dir whose programs run inside the image (k3cluster's
    _bin paths); the client k3pd-cli is the host build's (it is not in the image)."""
    spec = json.load(open(os.path.join(bundle, "config.json")))
    u = spec["process"]["user"]
    user = "%d:%d" % (u["uid"], u.get("gid", 0))
    check(user == "10001:10001", "the image's runtime config runs as 10001:10001 (got %s)" % user)
    check(spec["process"]["args"] == ["k3pd-router", "--help"] and spec["process"]["cwd"] == "/tmp",
          "the image's default command is k3pd-router --help in /tmp (%s)" % spec["process"]["args"])
    wdir = os.path.join(run, "..", "image-bin")
    for sub, name in BINS.items():
        os.makedirs(os.path.join(wdir, sub), exist_ok=True)
        path = os.path.join(wdir, sub, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\nexec %s %s --user %s --bind %s -- /usr/local/bin/%s \"$@\"\n" % (
                os.path.join(ROOT, "scripts", "image", "run-in-rootfs.sh"), os.path.join(bundle, "rootfs"),
                user, run, name))
        os.chmod(path, 0o755)
    os.makedirs(os.path.join(wdir, "tools", "cli"), exist_ok=True)
    cli = os.path.join(wdir, "tools", "cli", "k3pd-cli")
    if not os.path.exists(cli):
        os.symlink(os.path.join(bindir, "tools", "cli", "k3pd-cli"), cli)
    return os.path.abspath(wdir), user


def monolithic(bindir, model, prompt, max_new):
    out = subprocess.run([os.path.join(bindir, "tools", "generate", "k3pd-generate"), "--model", model, "--prompt-ids",
                          ",".join(map(str, prompt)), "--max-new-tokens", str(max_new), "--ignore-eos"] + WORKER_ARGS,
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise AssertionError("host k3pd-generate failed: %s" % out.stderr[-1000:])
    return [int(x) for x in [ln for ln in out.stdout.splitlines() if ln.startswith("ids:")][-1][4:].split()]


def generate(cl, stubs, **kw):
    c, g, _, _ = stubs
    max_new = kw.pop("max_new")
    req = g.GenerateRequest(sampling=c.SamplingParams(temperature=0.0),
                            stop=c.StopConditions(max_new_tokens=max_new, ignore_eos=True), **kw)
    ids, text, final = [], "", None
    for chunk in cl.generate_call()(req, timeout=120):
        ids += list(chunk.token_ids)
        text += chunk.text
        if chunk.finish_reason:
            final = chunk
    return ids, text, final


def check_process(p, rootfs, run):
    pid = p.p.pid
    exe = os.readlink("/proc/%d/exe" % pid)
    root = os.readlink("/proc/%d/root" % pid)
    check(root == rootfs and exe.startswith(rootfs + "/usr/local/bin/"),
          "%s: root is the image (%s), executable %s" % (p.name, root, exe[len(rootfs):]))
    libs = set()
    for ln in open("/proc/%d/maps" % pid):
        f = ln.split(None, 5)
        if len(f) == 6 and f[5].startswith("/") and ".so" in f[5]:
            libs.add(f[5].strip())
    foreign = sorted(x for x in libs if not x.startswith(rootfs + "/"))
    check(len(libs) >= 10 and not foreign,
          "%s: all %d mapped shared libraries are the image's (outside it: %s)" % (p.name, len(libs), foreign))
    uids = [ln.split()[1:] for ln in open("/proc/%d/status" % pid) if ln.startswith("Uid:")][0]
    check(set(uids) == {"10001"}, "%s: runs as uid 10001 (%s)" % (p.name, uids))


def scrape(p, path):
    m = re.search(r"metrics on port (\d+)", p.text())
    check(m is not None, "%s logged its metrics port" % p.name)
    with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % m.group(1), timeout=10) as r:
        text = r.read().decode()
    with open(path, "w") as f:
        f.write(text)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bindir", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--extra-pkgs", default="")
    ap.add_argument("--image-dir", help="an image already built by scripts/image/build.sh --out DIR")
    args = ap.parse_args()
    args.bindir = os.path.abspath(args.bindir)
    if os.geteuid() != 0:
        print("SKIP: needs root: the image is built with mmdebstrap --mode=root and run with chroot in a "
              "mount namespace")
        return 77
    work = os.path.abspath(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if args.image_dir:
        out = os.path.abspath(args.image_dir)
        check(os.path.isdir(os.path.join(out, "bundle", "rootfs")), "using the image built in %s" % out)
    else:
        out = os.path.join(work, "image")
        build_image(args, out)
    bundle = os.path.join(out, "bundle")
    rootfs = os.path.realpath(os.path.join(bundle, "rootfs"))
    run = os.path.join(work, "run")
    os.makedirs(run)
    os.chown(run, 10001, 10001)  # the image's user writes port files, certificates and the model here
    wdir, user = wrappers(bundle, run, args.bindir)

    model = os.path.join(run, "model")
    p = subprocess.run([os.path.join(wdir, "tools", "mkckpt", "k3pd-mkckpt"), "--preset", "tiny", "--out", model,
                        "--seed", "1"], capture_output=True, text=True, timeout=300)
    check(p.returncode == 0 and os.path.exists(os.path.join(model, "config.json")),
          "the image's k3pd-mkckpt wrote the tiny checkpoint as %s (%s)" % (user, p.stderr[-300:]))

    stubs = load_stubs(args.gen)
    cl = Cluster(wdir, model, run, worker_args=WORKER_ARGS + METRICS, router_args=METRICS, stubs=stubs)
    ok = False
    try:
        cl.start()
        check(True, "router + 1 prefill + 1 decode started from the image and registered (mutual TLS)")
        for proc in cl.procs:
            check_process(proc, rootfs, run)
        g = stubs[1]
        chat = g.ChatInput(messages=[g.ChatMessage(role=g.CHAT_ROLE_USER, content="Hello")],
                           add_generation_prompt=True)
        ids, text, final = generate(cl, stubs, chat=chat, max_new=12)
        check(len(ids) == 12 and final is not None and final.usage.completion_tokens == 12,
              "chat request served from the image: %d tokens, text %r" % (len(ids), text[:40]))
        prompt = [5, 17, 300, 41, 9, 1000, 77, 3]
        ids, _, _ = generate(cl, stubs, token_ids=g.TokenIds(ids=prompt), max_new=10)
        want = monolithic(args.bindir, model, prompt, 10)
        check(ids == want, "token-id request from the image equals the host's k3pd-generate (%s)" % ids)
        pages = [scrape(proc, os.path.join(run, "metrics-%s.txt" % proc.name)) for proc in cl.procs]
        check(re.search(r'^k3pd_router_requests_total\{status="ok"\} 2$', pages[0], re.M) is not None,
              "router metrics count the 2 requests as ok")
        files = [os.path.join(run, "metrics-%s.txt" % proc.name) for proc in cl.procs]
        d = subprocess.run([sys.executable, os.path.join(HERE, "check_dashboard.py"), "--dashboard",
                            os.path.join(ROOT, "deploy", "grafana", "k3pd-dashboard.json"), "--adapter",
                            os.path.join(ROOT, "deploy", "k8s", "prometheus-adapter", "values.yaml"),
                            "--exposition"] + files, capture_output=True, text=True, timeout=60)
        print(d.stdout, d.stderr, end="")
        check(d.returncode == 0, "every dashboard query names metrics, labels and values these processes serve")
        codes = cl.stop()
        check(all(v == 0 for v in codes.values()), "SIGTERM stopped every process with status 0: %s" % codes)
        ok = True
    finally:
        if not ok:
            cl.stop()
            cl.dump_logs()
    print("test_image: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
