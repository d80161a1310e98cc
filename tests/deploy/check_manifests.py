#!/usr/bin/python3
"""Offline checker for the k3pd Kubernetes manifests.

Renders each kustomize overlay with `kubectl kustomize` (no cluster needed) and asserts the
invariants the binaries and the operator guide rely on (docs/operations.md, "Manifest
contract"). It is not a schema validator: kubectl's client-side rendering already rejects
malformed kustomizations, and yamllint checks syntax; this checks meaning.

Usage:
  check_manifests.py --kubectl KUBECTL --deploy DIR --docs DOCS_METRICS_MD OVERLAY_DIR...
  check_manifests.py ... --expect-violations FILE OVERLAY_DIR
      (negative test: succeeds only if the overlay fails and every line of FILE appears in
      some violation message)

Uses only the Python standard library and PyYAML (python3-yaml, which yamllint depends on).
"""
import argparse
import re
import subprocess
import sys

import yaml

ROLES = ("router", "prefill", "decode")
# Slack between the drain grace a worker is given and the moment the kubelet kills it:
# deregistration, closing streams with a status, flushing logs, process exit.
GRACE_SLACK_MS = 5000


def render(kubectl, overlay):
    p = subprocess.run([kubectl, "kustomize", overlay], capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {overlay} failed:\n{p.stderr}")
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def port_of(hostport):
    m = re.fullmatch(r"(.*):(\d+)", hostport or "")
    return (m.group(1), int(m.group(2))) if m else (None, None)


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def selects(sel, labels):
    """A label selector ({matchLabels, matchExpressions}; {} selects everything) against labels."""
    if sel is None:
        return False
    if not all(labels.get(k) == v for k, v in (sel.get("matchLabels") or {}).items()):
        return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
        ok = {"In": labels.get(k) in vals, "NotIn": labels.get(k) not in vals, "Exists": k in labels,
              "DoesNotExist": k not in labels}.get(op, False)
        if not ok:
            return False
    return True


def rule_allows_port(rule, port, name=None):
    ports = rule.get("ports")
    return not ports or any(p.get("port") in (port, name) for p in ports)


class Checker:
    def __init__(self, docs, known_metrics, adapter_metrics):
        self.docs = docs
        self.known_metrics = known_metrics
        self.adapter_metrics = adapter_metrics
        self.errors = []

    def err(self, where, msg):
        self.errors.append(f"{where}: {msg}")

    def of_kind(self, kind):
        return [d for d in self.docs if d.get("kind") == kind]

    def run(self):
        seen = set()
        for d in self.docs:
            key = (d.get("kind"), d.get("metadata", {}).get("namespace"),
                   d.get("metadata", {}).get("name"))
            if None in (key[0], key[2]) or not d.get("apiVersion"):
                self.err(str(key), "object lacks apiVersion, kind or metadata.name")
            if key in seen:
                self.err(str(key), "duplicate object")
            seen.add(key)
        self.configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in self.of_kind("ConfigMap")}
        self.pvcs = {d["metadata"]["name"] for d in self.of_kind("PersistentVolumeClaim")}
        self.deployments = {d["metadata"]["name"]: d for d in self.of_kind("Deployment")}
        self.services = {d["metadata"]["name"]: d for d in self.of_kind("Service")}
        self.secrets = {d["metadata"]["name"] for d in self.of_kind("Secret")}
        self.secrets |= {d.get("spec", {}).get("secretName") for d in self.of_kind("Certificate")}
        self.policies = self.of_kind("NetworkPolicy")
        self.router_ports = {}  # name -> containerPort of the router container
        roles = {}
        for name, dep in self.deployments.items():
            role = self.check_deployment(name, dep)
            if role:
                roles[role] = name
        for r in ROLES:
            if r not in roles:
                self.err("overlay", f"no Deployment for role {r}")
        for name, svc in self.services.items():
            self.check_service(name, svc)
        self.check_network_policies(roles)
        self.check_selectors("PodDisruptionBudget", roles)
        self.check_hpas(roles)
        return self.errors

    # ---- Deployments ----
    def pod_labels(self, dep):
        return dep.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})

    def check_deployment(self, name, dep):
        w = f"Deployment/{name}"
        spec = dep.get("spec", {})
        tmpl = spec.get("template", {})
        pod = tmpl.get("spec", {})
        labels = self.pod_labels(dep)
        if not matches(spec.get("selector", {}).get("matchLabels"), labels):
            self.err(w, "spec.selector.matchLabels does not match the pod template labels")
        role = labels.get("app.kubernetes.io/component")
        if role not in ROLES:
            self.err(w, f"pod label app.kubernetes.io/component={role!r} is not one of {ROLES}")
            role = None
        psc = pod.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True:
            self.err(w, "pod securityContext.runAsNonRoot must be true")
        if psc.get("runAsUser", 1) == 0:
            self.err(w, "pod securityContext.runAsUser is 0 (root)")
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        for v in vols.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in self.pvcs:
                self.err(w, f"volume {v['name']} uses PersistentVolumeClaim {claim} which is not rendered")
            sec = v.get("secret", {}).get("secretName")
            if sec and sec not in self.secrets:
                self.err(w, f"volume {v['name']} uses Secret {sec}, which is neither rendered nor issued by a "
                            f"rendered cert-manager Certificate")
        containers = pod.get("containers", [])
        if len(containers) != 1:
            self.err(w, f"expected exactly one k3pd container, found {len(containers)}")
        for c in pod.get("initContainers", []) + containers:
            self.check_container_common(f"{w} container {c.get('name')}", c, vols)
        for c in containers:
            self.check_main_container(w, role, dep, c, vols)
        return role

    def check_container_common(self, w, c, vols):
        res = c.get("resources", {})
        req, lim = res.get("requests", {}), res.get("limits", {})
        for k in ("cpu", "memory"):
            if k not in req:
                self.err(w, f"resources.requests.{k} missing")
        if "memory" not in lim:
            self.err(w, "resources.limits.memory missing")
        for k in set(req) | set(lim):
            if "/" in k and str(req.get(k)) != str(lim.get(k)):
                self.err(w, f"extended resource {k}: requests ({req.get(k)}) must equal limits ({lim.get(k)})")
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            self.err(w, "securityContext.allowPrivilegeEscalation must be false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            self.err(w, "securityContext.capabilities.drop must include ALL")
        if sc.get("runAsUser", 1) == 0 or sc.get("runAsNonRoot") is False:
            self.err(w, "container runs as root")
        img = c.get("image", "")
        if "@" not in img and not re.search(r":[^/]+$", img):
            self.err(w, f"image {img!r} has no tag or digest (unresolved kustomize image name?)")
        for m in c.get("volumeMounts", []):
            if m.get("name") not in vols:
                self.err(w, f"volumeMount {m.get('name')} names no volume")

    def resolve_env(self, w, c):
        env = {}
        for src in c.get("envFrom", []):
            ref = src.get("configMapRef", {}).get("name")
            if ref is not None:
                if ref not in self.configmaps:
                    self.err(w, f"envFrom ConfigMap {ref} is not rendered")
                env.update(self.configmaps.get(ref, {}))
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "valueFrom" in e:
                env[e["name"]] = "<from-field>"
        # Flags given as arguments win over the environment (flags.h).
        args = c.get("args", [])
        for i, a in enumerate(args):
            if a.startswith("--"):
                k, _, v = a[2:].partition("=")
                if not _ and i + 1 < len(args):
                    v = args[i + 1]
                env["K3PD_" + k.upper().replace("-", "_")] = v
        return env

    def check_main_container(self, w, role, dep, c, vols):
        w = f"{w} container {c.get('name')}"
        pod = dep["spec"]["template"]
        cmd = (c.get("command") or [""])[0]
        if role and cmd != f"/usr/local/bin/k3pd-{role}":
            self.err(w, f"command {cmd!r} does not run k3pd-{role}")
        ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
        env = self.resolve_env(w, c)
        _, listen = port_of(env.get("K3PD_LISTEN"))
        if listen is None:
            self.err(w, "K3PD_LISTEN (--listen HOST:PORT) is not set")
        elif ports.get("grpc") != listen:
            self.err(w, f"containerPort grpc={ports.get('grpc')} but --listen port is {listen}")
        mport = env.get("K3PD_METRICS_PORT")
        if mport is None or not str(mport).isdigit() or int(mport) == 0:
            self.err(w, "K3PD_METRICS_PORT (--metrics-port N) must be a fixed port")
        else:
            if ports.get("metrics") != int(mport):
                self.err(w, f"containerPort metrics={ports.get('metrics')} but --metrics-port is {mport}")
            ann = pod.get("metadata", {}).get("annotations", {})
            if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != str(mport):
                self.err(w, f"prometheus.io scrape annotations do not point at metrics port {mport}")
        model = env.get("K3PD_MODEL")
        mounts = [m for m in c.get("volumeMounts", []) if model and
                  (model + "/").startswith(m.get("mountPath", "").rstrip("/") + "/")]
        if not model:
            self.err(w, "K3PD_MODEL (--model DIR) is not set")
        elif not mounts or not mounts[0].get("readOnly"):
            self.err(w, f"--model {model} is not on a read-only volume mount")
        # The gRPC ports speak TLS; the kubelet's gRPC probes cannot, so they use the plaintext
        # health-only port (--health-listen), which serves grpc.health.v1 and nothing else.
        _, health = port_of(env.get("K3PD_HEALTH_LISTEN"))
        if health is None:
            self.err(w, "K3PD_HEALTH_LISTEN (--health-listen HOST:PORT) is not set: probes need a plaintext port")
        elif ports.get("health") != health:
            self.err(w, f"containerPort health={ports.get('health')} but --health-listen port is {health}")
        self.check_tls(w, env, c, vols)
        if role == "router":
            self.router_ports = dict(ports)
            _, cport = port_of(env.get("K3PD_CLUSTER_LISTEN"))
            if cport is None:
                self.err(w, "K3PD_CLUSTER_LISTEN (--cluster-listen HOST:PORT) is not set")
            elif ports.get("cluster") != cport:
                self.err(w, f"containerPort cluster={ports.get('cluster')} but --cluster-listen port is {cport}")
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            pr = c.get(kind)
            if pr is None:
                if kind != "startupProbe":
                    self.err(w, f"{kind} missing")
                continue
            g = pr.get("grpc")
            if not g:
                self.err(w, f"{kind} is not a native grpc probe")
                continue
            if g.get("port") != ports.get("health"):
                self.err(w, f"{kind} grpc port {g.get('port')} is not the health port {ports.get('health')}")
            want = "" if kind == "readinessProbe" else "liveness"
            if g.get("service", "") != want:
                self.err(w, f"{kind} grpc service must be {want!r} (health contract)")
        if role in ("prefill", "decode"):
            self.check_router_list(w, env.get("K3PD_ROUTER"))
            if "K3PD_ADVERTISE" not in env:
                self.err(w, "K3PD_ADVERTISE is not set (the router could not dial the worker back)")
            grace = env.get("K3PD_DRAIN_GRACE_MS")
            tgps = pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
            if grace is None or not str(grace).isdigit():
                self.err(w, "K3PD_DRAIN_GRACE_MS (--drain-grace-ms N) is not set")
            elif tgps * 1000 < int(grace) + GRACE_SLACK_MS:
                self.err(w, f"terminationGracePeriodSeconds {tgps} s is less than the drain grace "
                            f"{grace} ms + {GRACE_SLACK_MS} ms")

    def router_replicas(self):
        return max([d["spec"].get("replicas", 1) for d in self.deployments.values()
                    if self.pod_labels(d).get("app.kubernetes.io/component") == "router"] or [1])

    def check_router_list(self, w, value):
        """--router: comma-separated HOST:PORT or dns:NAME:PORT entries, each leading to the routers'
        cluster port; with several router replicas a worker must find all of them through a dns:
        entry of a headless Service (a plain Service name would reach one replica per connection)."""
        entries = [e.strip() for e in str(value or "").split(",") if e.strip()]
        if not entries:
            self.err(w, "K3PD_ROUTER (--router) is not set")
            return
        dns_ok = False
        for e in entries:
            dns = e.startswith("dns:")
            host, rport = port_of(e[4:] if dns else e)
            svc = self.services.get((host or "").split(".")[0])
            if svc is None:
                self.err(w, f"--router {e} does not name a rendered Service")
                continue
            sp = [p for p in svc["spec"].get("ports", []) if p.get("port") == rport]
            if not sp:
                self.err(w, f"--router port {rport} is not a port of Service {host}")
            elif sp[0].get("targetPort", rport) not in ("cluster", 50052) and \
                    sp[0].get("targetPort") != self.cluster_port():
                self.err(w, f"--router {e} does not lead to the router's cluster port "
                            f"(targetPort {sp[0].get('targetPort')})")
            sel = svc["spec"].get("selector", {})
            if not any(matches(sel, self.pod_labels(d)) and
                       self.pod_labels(d).get("app.kubernetes.io/component") == "router"
                       for d in self.deployments.values()):
                self.err(w, f"--router Service {host} does not select the router pods")
            if dns:
                if svc["spec"].get("clusterIP") != "None":
                    self.err(w, f"--router {e}: Service {host} is not headless (clusterIP: None), so its name "
                                f"resolves to one virtual IP, not to every router pod")
                elif svc["spec"].get("publishNotReadyAddresses") is not True:
                    self.err(w, f"--router {e}: Service {host} lacks publishNotReadyAddresses: true (starting "
                                f"and draining routers would get no heartbeats)")
                else:
                    dns_ok = True
        n = self.router_replicas()
        if n > 1 and not dns_ok:
            self.err(w, f"the router runs {n} replicas but --router {value} has no dns: entry of a headless "
                        f"Service: the worker would register with one replica only")

    def cluster_port(self):
        for d in self.deployments.values():
            if self.pod_labels(d).get("app.kubernetes.io/component") == "router":
                for c in d["spec"]["template"]["spec"].get("containers", []):
                    for p in c.get("ports", []):
                        if p.get("name") == "cluster":
                            return p.get("containerPort")
        return None

    def check_tls(self, w, env, c, vols):
        """Mutual TLS between router and workers with certificates from a Secret."""
        if str(env.get("K3PD_INSECURE_CLUSTER", "false")).lower() in ("1", "true", "yes", "on"):
            self.err(w, "K3PD_INSECURE_CLUSTER is set: router<->worker traffic would not be authenticated")
        mounts = c.get("volumeMounts", [])
        for var in ("K3PD_TLS_CERT", "K3PD_TLS_KEY", "K3PD_TLS_CA"):
            f = env.get(var)
            if not f:
                self.err(w, f"{var} is not set (mutual TLS needs a certificate, its key and the cluster CA)")
                continue
            m = [x for x in mounts if f.startswith(x.get("mountPath", "").rstrip("/") + "/")]
            v = vols.get(m[0].get("name")) if m else None
            if not m or not m[0].get("readOnly") or not v or "secret" not in v:
                self.err(w, f"{var} {f} is not on a read-only mount of a Secret volume")

    # ---- Services, PDBs, HPAs ----
    def check_service(self, name, svc):
        w = f"Service/{name}"
        sel = svc.get("spec", {}).get("selector")
        pods = [d for d in self.deployments.values() if matches(sel, self.pod_labels(d))]
        if not pods:
            self.err(w, f"selector {sel} matches no Deployment's pod labels")
            return
        if any(self.pod_labels(d).get("app.kubernetes.io/component") == "router" for d in pods):
            cport = self.cluster_port()
            tps = [p.get("targetPort", p.get("port")) for p in svc["spec"].get("ports", [])]
            if "cluster" in tps or (cport is not None and cport in tps):
                if any(t in ("grpc", "http", 50051, 8000) for t in tps):
                    self.err(w, "exposes the router's cluster port next to its public ports (the cluster port "
                                "needs its own ClusterIP Service)")
                if svc["spec"].get("type", "ClusterIP") != "ClusterIP":
                    self.err(w, f"exposes the router's cluster port outside the cluster "
                                f"(type {svc['spec'].get('type')})")
        for p in svc["spec"].get("ports", []):
            tp = p.get("targetPort", p.get("port"))
            for d in pods:
                cports = [cp for c in d["spec"]["template"]["spec"].get("containers", [])
                          for cp in c.get("ports", [])]
                if not any(tp in (cp.get("name"), cp.get("containerPort")) for cp in cports):
                    self.err(w, f"targetPort {tp} is not a container port of Deployment/{d['metadata']['name']}")

    def check_network_policies(self, roles):
        """Default deny for every k3pd pod; the router's cluster port only from the workers; the
        workers' gRPC port only from k3pd pods."""
        ingress = [p for p in self.policies if "Ingress" in (p.get("spec", {}).get("policyTypes") or ["Ingress"])]
        for r, dname in roles.items():
            labels = self.pod_labels(self.deployments[dname])
            if not any(selects(p["spec"].get("podSelector"), labels) for p in ingress):
                self.err(f"Deployment/{dname}", "no NetworkPolicy restricts ingress to its pods")
        rlab = self.pod_labels(self.deployments[roles["router"]]) if "router" in roles else None
        cport = self.cluster_port()
        worker_labels = [self.pod_labels(self.deployments[roles[r]]) for r in ("prefill", "decode") if r in roles]
        k3pd_labels = [self.pod_labels(d) for d in self.deployments.values()]
        for p in ingress:
            w = f"NetworkPolicy/{p['metadata']['name']}"
            sel = p["spec"].get("podSelector")
            for rule in p["spec"].get("ingress") or []:
                peers = rule.get("from")
                if rlab and cport and selects(sel, rlab) and rule_allows_port(rule, cport, "cluster"):
                    ok = bool(peers) and all(set(q) == {"podSelector"} and
                                             not selects(q["podSelector"], rlab) and
                                             any(selects(q["podSelector"], wl) for wl in worker_labels)
                                             for q in peers)
                    if not ok:
                        self.err(w, f"allows the router's cluster port {cport} from sources other than the "
                                    f"prefill and decode pods")
                for wl in worker_labels:
                    if selects(sel, wl) and rule_allows_port(rule, 50051, "grpc"):
                        ok = bool(peers) and all(set(q) == {"podSelector"} and
                                                 any(selects(q["podSelector"], kl) for kl in k3pd_labels)
                                                 for q in peers)
                        if not ok:
                            self.err(w, "allows the workers' gRPC port 50051 from outside the k3pd pods")
                        break

    def check_selectors(self, kind, roles):
        covered = set()
        for o in self.of_kind(kind):
            w = f"{kind}/{o['metadata']['name']}"
            sel = o.get("spec", {}).get("selector", {}).get("matchLabels")
            hit = [n for n, d in self.deployments.items() if matches(sel, self.pod_labels(d))]
            if not hit:
                self.err(w, f"selector {sel} matches no Deployment")
            covered.update(hit)
        for r in ROLES:
            if r in roles and roles[r] not in covered:
                self.err("overlay", f"no {kind} covers Deployment/{roles[r]}")

    def check_hpas(self, roles):
        scaled = set()
        for h in self.of_kind("HorizontalPodAutoscaler"):
            w = f"HorizontalPodAutoscaler/{h['metadata']['name']}"
            ref = h.get("spec", {}).get("scaleTargetRef", {})
            if ref.get("kind") != "Deployment" or ref.get("name") not in self.deployments:
                self.err(w, f"scaleTargetRef {ref.get('kind')}/{ref.get('name')} does not exist")
            scaled.add(ref.get("name"))
            for m in h["spec"].get("metrics", []):
                if m.get("type") != "Pods":
                    continue
                mname = m["pods"]["metric"]["name"]
                if mname not in self.known_metrics:
                    self.err(w, f"metric {mname} is not a k3pd metric (docs/metrics.md)")
                if mname not in self.adapter_metrics:
                    self.err(w, f"metric {mname} has no prometheus-adapter rule")
        for r in ("prefill", "decode"):
            if r in roles and roles[r] not in scaled:
                self.err("overlay", f"no HorizontalPodAutoscaler scales Deployment/{roles[r]}")


def load_adapter(deploy):
    vals = yaml.safe_load(open(f"{deploy}/k8s/prometheus-adapter/values.yaml"))
    cm = yaml.safe_load(open(f"{deploy}/k8s/prometheus-adapter/adapter-config.yaml"))
    rules = vals["rules"]["custom"]
    if yaml.safe_load(cm["data"]["config.yaml"])["rules"] != rules:
        raise RuntimeError("prometheus-adapter/adapter-config.yaml and values.yaml disagree")
    return {r["name"]["as"] for r in rules}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubectl", default="kubectl")
    ap.add_argument("--deploy", required=True, help="the repository's deploy/ directory")
    ap.add_argument("--docs", required=True, help="docs/metrics.md")
    ap.add_argument("--expect-violations")
    ap.add_argument("overlays", nargs="+")
    a = ap.parse_args()
    known = set(re.findall(r"^\| `(k3pd_[a-z0-9_]+)` \|", open(a.docs).read(), re.M))
    adapter = load_adapter(a.deploy)
    all_errors, bad = [], 0
    for ov in a.overlays:
        errs = Checker(render(a.kubectl, ov), known, adapter).run()
        all_errors += errs
        bad += bool(errs)
        print(f"{ov}: {'OK' if not errs else f'{len(errs)} violation(s)'}")
        for e in errs:
            print(f"  {e}")
    if a.expect_violations:
        want = [l.strip() for l in open(a.expect_violations) if l.strip() and not l.startswith("#")]
        missing = [s for s in want if not any(s in e for e in all_errors)]
        for s in missing:
            print(f"expected violation not reported: {s}")
        ok = bad > 0 and not missing
        print(f"negative check {'passed' if ok else 'FAILED'}: {len(want) - len(missing)} of "
              f"{len(want)} expected violations reported")
        return 0 if ok else 1
    print(f"{len(a.overlays) - bad} overlay(s) OK, {bad} with violations")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
