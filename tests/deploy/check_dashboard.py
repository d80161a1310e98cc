#!/usr/bin/python3
"""Checks deploy/grafana/k3pd-dashboard.json against the metrics the binaries really export.

Every PromQL expression of the dashboard (panel targets and template-variable queries) is
tokenised; each identifier must be a PromQL function/keyword, a label of the metric it
qualifies, or an exported metric (histograms through _bucket/_sum/_count only). Label names
in `by (...)` and in `{...}` matchers must belong to the metric (or be a target label that
Prometheus attaches: namespace, pod, instance, job).

Where the exported metrics come from:
  --source DIR        the registration table common/metrics/metrics_k3pd.c (+ its header):
                      one row per metric with its type and label names (offline, ctest
                      deploy_dashboard);
  --exposition FILE   /metrics pages scraped from running binaries (the image test scrapes
                      router + prefill + decode started from the image): families, types,
                      labels and label values as served. Label values in `=` matchers must
                      then occur in the scrape.
Also checked: the topics the dashboard must show (TTFT and ITL percentiles, tokens/s, queue
depth, KV pages and KDA slots, handoff bandwidth and failures) each have a panel; every
prometheus-adapter rule (deploy/k8s/prometheus-adapter/values.yaml) names an exported metric
and the dashboard shows its metricsQuery as the HPA sees it; panel ids are unique.
With --promtool P: every expression also parses with Prometheus's own parser (promtool is in
Debian's prometheus package, which scripts/deps.sh does not install: on a host with systemd it
would start a Prometheus server on port 9090; ctest passes it when it is installed).
With --kubectl K --kustomize DIR: DIR (deploy/grafana) renders to one ConfigMap labelled
grafana_dashboard=1 whose data is exactly the dashboard file.
Usage: check_dashboard.py --dashboard JSON --adapter VALUES_YAML (--source DIR | --exposition FILE...)
                          [--self-test] [--promtool PROMTOOL] [--kubectl KUBECTL --kustomize DIR]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

FUNCS = {"sum", "avg", "min", "max", "count", "rate", "irate", "increase", "delta",
         "histogram_quantile", "avg_over_time", "max_over_time", "min_over_time", "sum_over_time",
         "topk", "bottomk", "clamp_min", "clamp_max", "abs", "vector", "scalar", "label_values"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
            "bool", "offset"}
TARGET_LABELS = {"namespace", "pod", "instance", "job"}
HIST_SUFFIXES = ("_bucket", "_sum", "_count")
# Topic -> metrics of which at least one must appear in some panel.
TOPICS = {
    "TTFT percentiles": ["k3pd_router_time_to_first_token_seconds_bucket"],
    "ITL percentiles": ["k3pd_router_inter_token_latency_seconds_bucket"],
    "tokens/s": ["k3pd_router_generation_tokens_total"],
    "queue depth": ["k3pd_prefill_queued_prompt_tokens", "k3pd_prefill_queued_requests"],
    "KV pages in use": ["k3pd_decode_kv_pages"],
    "KDA slots in use": ["k3pd_decode_kda_slots"],
    "handoff bandwidth": ["k3pd_prefill_handoff_bytes_total"],
    "handoff failures": ["k3pd_prefill_handoff_failures_total"],
}


class Family:
    def __init__(self, mtype, labels):
        self.type = mtype          # counter | gauge | histogram
        self.labels = set(labels)  # label names (without le)
        self.values = None         # label -> set of values seen (exposition only)


def from_source(src):
    """Families from the registration table (rows {R_ROLE, NAME, TYPE, L("label", ...)...})."""
    header = open(f"{src}/../include/k3pd/metrics_k3pd.h").read()
    macros = dict(re.findall(r'#define (K3PD_M_\w+) "(k3pd_\w+)"', header))
    text = open(f"{src}/metrics_k3pd.c").read()
    kinds = {"C": "counter", "G": "gauge", "H": "histogram"}
    fams = {}
    for name, kind, label in re.findall(
            r'\{R_\w+,\s*("k3pd_\w+"|K3PD_M_\w+),\s*([CGH]),\s*(?:L\("(\w+)"|NOL)', text):
        name = macros[name] if name.startswith("K3PD_M_") else name.strip('"')
        fams[name] = Family(kinds[kind], [label] if label else [])
    for name, label2 in re.findall(r'\{"(k3pd_\w+)",\s*L\("(\w+)"', text):  # second labels
        fams[name].labels.add(label2)
    fams.get("k3pd_build_info", Family("gauge", [])).labels |= {"role", "version"}
    if len(fams) < 30:
        raise RuntimeError(f"{src}/metrics_k3pd.c: only {len(fams)} metric rows parsed; did the table change?")
    return fams


def from_exposition(files):
    fams = {}
    for f in files:
        for line in open(f):
            m = re.match(r"# TYPE (\w+) (\w+)", line)
            if m:
                fams.setdefault(m.group(1), Family(m.group(2), []))
                continue
            m = re.match(r"(\w+?)(_bucket|_sum|_count)?(\{(.*)\})? ", line)
            if not m or line.startswith("#"):
                continue
            base = m.group(1) if m.group(1) in fams else m.group(1) + (m.group(2) or "")
            fam = fams.get(base)
            if fam is None:
                continue
            fam.values = fam.values or {}
            for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(4) or ""):
                if k != "le":
                    fam.labels.add(k)
                    fam.values.setdefault(k, set()).add(v)
    return fams


def exprs(dash):
    """(where, expr) for every PromQL expression of the dashboard."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p.get('id')} '{p.get('title')}' target {t.get('refId')}", t.get("expr", "")))
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            out.append((f"variable ${v['name']}", q))
    return out


def metric_of(name, fams):
    """(family name, suffix) of an identifier that names a series, or (None, None)."""
    if name in fams:
        return name, ""
    for s in HIST_SUFFIXES:
        if name.endswith(s) and name[:-len(s)] in fams:
            return name[:-len(s)], s
    return None, None


def balanced(e):
    """None when (), [] and {} nest properly outside string literals, else what is wrong."""
    stack, pairs = [], {")": "(", "]": "[", "}": "{"}
    for i, ch in enumerate(re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: " " * len(m.group(0)), e)):
        if ch in "([{":
            stack.append((ch, i))
        elif ch in ")]}":
            if not stack or stack[-1][0] != pairs[ch]:
                return f"unbalanced {ch!r} at column {i + 1}"
            stack.pop()
        elif ch == '"':
            return f"unterminated string at column {i + 1}"
    return f"unbalanced {stack[-1][0]!r} at column {stack[-1][1] + 1}" if stack else None


def check_expr(where, expr, fams, errs, used):
    e = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m")
    e = re.sub(r"\$\{?\w+\}?", "x", e)  # other Grafana variables inside label values
    if not e.strip():
        errs.append(f"{where}: empty expression")
        return
    bad = balanced(e)
    if bad:
        errs.append(f"{where}: {bad}")
        return
    # Selectors: metric{matchers}. Checked first, then blanked out.
    for m in re.finditer(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}", e):
        fam, suffix = metric_of(m.group(1), fams)
        for lab, op, val in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"', m.group(2)):
            if fam is None:
                continue
            ok = lab in fams[fam].labels or lab in TARGET_LABELS or (lab == "le" and suffix == "_bucket")
            if not ok:
                errs.append(f"{where}: {m.group(1)} has no label {lab!r} (labels: {sorted(fams[fam].labels)})")
            vals = (fams[fam].values or {}).get(lab)
            if ok and op in ("=", "!=") and vals is not None and val != "x" and val not in vals:
                errs.append(f"{where}: {m.group(1)}{{{lab}{op}\"{val}\"}}: value never exported "
                            f"(seen: {sorted(vals)})")
    # Grafana's label_values(METRIC, LABEL): LABEL is a label name, not a series.
    for m in re.finditer(r"label_values\(\s*([\w:]+)[^,)]*,\s*(\w+)\s*\)", e):
        fam, _ = metric_of(m.group(1), fams)
        if fam is not None and m.group(2) not in fams[fam].labels | TARGET_LABELS:
            errs.append(f"{where}: label_values: {fam} has no label {m.group(2)!r}")
    e = re.sub(r"(label_values\([^,)]*),\s*\w+\s*\)", r"\1)", e)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r'"(?:[^"\\]|\\.)*"', " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    groups = re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", e)
    group_labels = {g.strip() for grp in groups for g in grp.split(",") if g.strip()}
    e = re.sub(r"\b(by|without)\s*\([^)]*\)", r" \1 ", e)
    names = set()
    for tok in re.findall(r"[a-zA-Z_:][\w:]*", e):
        if tok in FUNCS or tok in KEYWORDS:
            continue
        fam, suffix = metric_of(tok, fams)
        if fam is None:
            errs.append(f"{where}: {tok!r} is neither an exported metric nor a PromQL function")
            continue
        if suffix and fams[fam].type != "histogram":
            errs.append(f"{where}: {tok}: {fam} is a {fams[fam].type}, not a histogram")
        if not suffix and fams[fam].type == "histogram":
            errs.append(f"{where}: {tok} is a histogram: use {tok}_bucket, _sum or _count")
        names.add((fam, suffix))
        used.add(tok)
    allowed = set(TARGET_LABELS)
    for fam, suffix in names:
        allowed |= fams[fam].labels | ({"le"} if suffix == "_bucket" else set())
    for lab in sorted(group_labels - allowed):
        errs.append(f"{where}: grouping label {lab!r} is not a label of {sorted(f for f, _ in names)}")


def promtool_check(promtool, all_exprs):
    """Parses every expression with Prometheus's own parser (promtool check rules on a rules
    file holding them as recording rules); Grafana's variables get values first and its
    label_values(METRIC, LABEL) becomes METRIC."""
    rules = []
    for i, (where, e) in enumerate(all_exprs):
        e = e.replace("$__rate_interval", "1m").replace("$__interval", "1m")
        e = re.sub(r"\$\{?\w+\}?", ".*", e)
        e = re.sub(r"^label_values\(\s*([^,]*?)\s*,\s*\w+\s*\)$", r"\1", e.strip())
        rules.append({"record": f"k3pd:dashboard_check:{i}", "expr": e})
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
    try:
        out = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(f.name)
    if out.returncode == 0:
        return []
    errs = []
    for line in (out.stdout + out.stderr).splitlines():
        m = re.search(r"group \"dashboard\", rule (\d+), \"[^\"]*\": (.*)", line)
        if m:
            errs.append(f"{all_exprs[int(m.group(1)) - 1][0]}: promtool: {m.group(2)}")
    return errs or [f"promtool check rules failed: {(out.stdout + out.stderr).strip()[-500:]}"]


def check(dash, adapter, fams, promtool=None):
    errs, used = [], set()
    ids = []

    def walk(panels):
        for p in panels:
            ids.append(p.get("id"))
            if p.get("type") != "row" and not p.get("targets"):
                errs.append(f"panel {p.get('id')} '{p.get('title')}' has no query")
            walk(p.get("panels", []))
    walk(dash.get("panels", []))
    dup = {i for i in ids if ids.count(i) > 1}
    if dup or None in ids:
        errs.append(f"panel ids must be unique and set: duplicates {sorted(dup)}")
    all_exprs = exprs(dash)
    for where, expr in all_exprs:
        check_expr(where, expr, fams, errs, used)
    if promtool:
        errs += promtool_check(promtool, all_exprs)
    for topic, metrics in TOPICS.items():
        if not used & set(metrics):
            errs.append(f"no panel shows {topic} ({' or '.join(metrics)})")
    texts = {re.sub(r"\s+", "", e) for _, e in all_exprs}
    for rule in adapter["rules"]["custom"]:
        name = re.match(r"(\w+)", rule["seriesQuery"]).group(1)
        if metric_of(name, fams)[0] is None:
            errs.append(f"prometheus-adapter rule for {name}: the binaries export no such metric")
        shown = (rule["metricsQuery"].replace("<<.Series>>", name)
                 .replace("<<.LabelMatchers>>", 'namespace=~"$namespace"').replace("<<.GroupBy>>", "pod"))
        if re.sub(r"\s+", "", shown) not in texts:
            errs.append(f"no panel shows the HPA signal {name} as the adapter computes it: {shown}")
    return errs, len(all_exprs), used


# --self-test: each breakage, applied to the real dashboard, must be reported (the message
# must contain the given text), so the checker cannot silently pass everything.
BREAKAGES = [
    ("k3pd_router_inter_token_latency_seconds_bucket", "k3pd_router_inter_token_latency_bucket",
     "'k3pd_router_inter_token_latency_bucket' is neither"),
    ("sum by (state) (k3pd_decode_kda_slots", "sum by (status) (k3pd_decode_kda_slots", "grouping label 'status'"),
    ('k3pd_prefill_handoff_bytes_total{namespace', 'k3pd_prefill_handoff_bytes_total{regoin="x",namespace',
     "has no label 'regoin'"),
    ("rate(k3pd_decode_generated_tokens_total", "rat(k3pd_decode_generated_tokens_total", "'rat' is neither"),
    ("k3pd_decode_step_seconds_bucket", "k3pd_decode_step_seconds", "is a histogram"),
    ("k3pd_decode_running_sequences{", "k3pd_decode_running_sequences_count{", "is a gauge, not a histogram"),
    ("avg(avg_over_time(k3pd_decode_kv_utilization_ratio", "max(avg_over_time(k3pd_decode_kv_utilization_ratio",
     "HPA signal k3pd_decode_kv_utilization_ratio"),
    ("k3pd_prefill_handoff_failures_total", "k3pd_prefill_handoff_failed_total", "handoff failures"),
    ("by (le) (rate(", "by (le) ((rate(", "unbalanced '('"),
]


def self_test(dash, adapter, fams, promtool=None):
    problems = []
    base, _, _ = check(dash, adapter, fams, promtool)
    if base:
        return [f"self-test needs a clean dashboard first: {base[0]}"]
    for old, new, want in BREAKAGES:
        def sub(node):
            if isinstance(node, dict):
                return {k: sub(v) for k, v in node.items()}
            if isinstance(node, list):
                return [sub(v) for v in node]
            return node.replace(old, new) if isinstance(node, str) else node
        broken = sub(dash)
        if broken == dash:
            problems.append(f"self-test: {old!r} no longer occurs in the dashboard; update BREAKAGES")
            continue
        errs, _, _ = check(broken, adapter, fams, promtool)
        if not any(want in e for e in errs):
            problems.append(f"self-test: replacing {old!r} by {new!r} was not reported as {want!r} (got {errs})")
    return problems


def check_configmap(kubectl, kdir, dashboard_path):
    out = subprocess.run([kubectl, "kustomize", kdir], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return [f"kubectl kustomize {kdir} failed: {out.stderr.strip()}"]
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    if len(docs) != 1 or docs[0].get("kind") != "ConfigMap":
        return [f"{kdir}: expected one ConfigMap, got {[d.get('kind') for d in docs]}"]
    cm, errs = docs[0], []
    if cm["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
        errs.append(f"{kdir}: ConfigMap {cm['metadata']['name']} lacks the label grafana_dashboard=1")
    data = cm.get("data", {}).get("k3pd-dashboard.json")
    if data is None or json.loads(data) != json.load(open(dashboard_path)):
        errs.append(f"{kdir}: the ConfigMap's k3pd-dashboard.json is not the dashboard file")
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubectl")
    ap.add_argument("--promtool", help="also parse every expression with promtool (Prometheus's parser)")
    ap.add_argument("--kustomize", help="deploy/grafana (needs --kubectl)")
    ap.add_argument("--self-test", action="store_true", help="also check that known breakages are caught")
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--adapter", required=True, help="prometheus-adapter values.yaml")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--source", help="common/metrics")
    src.add_argument("--exposition", nargs="+", help="scraped /metrics pages")
    a = ap.parse_args()
    fams = from_source(a.source) if a.source else from_exposition(a.exposition)
    dash, adapter = json.load(open(a.dashboard)), yaml.safe_load(open(a.adapter))
    errs, n, used = check(dash, adapter, fams, a.promtool)
    if a.self_test and not errs:
        errs = self_test(dash, adapter, fams, a.promtool)
        if not errs:
            print(f"check_dashboard: self-test: all {len(BREAKAGES)} breakages reported")
    if a.kustomize and not errs:
        errs = check_configmap(a.kubectl or "kubectl", a.kustomize, a.dashboard)
        if not errs:
            print(f"check_dashboard: {a.kustomize} renders the dashboard ConfigMap (grafana_dashboard=1)")
    for e in errs:
        print(f"check_dashboard: {e}")
    what = f"{len(fams)} metrics from " + ("the registration table" if a.source else
                                           f"{len(a.exposition)} scraped /metrics page(s)")
    what += ", parsed by promtool" if a.promtool else " (promtool not given: syntax = balance check only)"
    print(f"check_dashboard: {n} expressions, {len(used)} series names, against {what}: "
          + ("OK" if not errs else f"{len(errs)} problem(s)"))
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
