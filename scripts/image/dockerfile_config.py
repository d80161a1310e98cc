#!/usr/bin/python3
"""Reads the runtime image's configuration from the last stage of a Dockerfile.

scripts/image/build.sh writes the image without Docker, so the Dockerfile's USER, WORKDIR,
EXPOSE, ENV, ENTRYPOINT, CMD and LABEL lines are the one description of the image's
configuration for both builds; this turns them into umoci config arguments, or into the JSON
that scripts/image/verify.sh compares the built image's config against.

Only the instruction forms the k3pd Dockerfiles use are accepted (exec-form CMD/ENTRYPOINT,
KEY=VALUE or KEY VALUE ENV/LABEL, ${ARG} substitution from ARG defaults or --arg overrides);
anything else in those instructions is an error rather than a silent difference.
Usage:
  dockerfile_config.py DOCKERFILE [--arg NAME=VALUE]... --umoci   one umoci argument per line
  dockerfile_config.py DOCKERFILE [--arg NAME=VALUE]... --json    the OCI config fields
  dockerfile_config.py DOCKERFILE --user-commands                 the stage's groupadd/useradd
                                                                  commands, one per line
  dockerfile_config.py DOCKERFILE [--arg ...] --check-image LAYOUT:TAG
        compares the image's config blob with the Dockerfile's (exit 1 naming each difference)
"""
import argparse
import json
import re
import shlex
import sys

# Docker's default for images without ENV PATH (the debian base image's value).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def last_stage(text):
    """Instructions (keyword, argument) of the last FROM stage, continuations joined."""
    text = re.sub(r"\\\n", " ", text)
    stage = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        kw, _, rest = line.partition(" ")
        kw = kw.upper()
        if kw == "FROM":
            stage = []
        elif stage is not None:
            stage.append((kw, rest.strip()))
    if stage is None:
        raise ValueError("no FROM line")
    return stage


def substitute(value, args):
    def one(m):
        name = m.group(1) or m.group(2)
        if name not in args:
            raise ValueError(f"${{{name}}} is not an ARG of the stage")
        return args[name]
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, value)


def pairs(rest, args, what):
    """KEY=VALUE KEY="VALUE" ... (or the legacy single KEY VALUE form)."""
    words = shlex.split(rest)
    if words and "=" not in words[0]:
        if len(words) < 2:
            raise ValueError(f"{what} {rest!r}: expected KEY=VALUE")
        return [(words[0], substitute(" ".join(words[1:]), args))]
    out = []
    for w in words:
        k, eq, v = w.partition("=")
        if not eq:
            raise ValueError(f"{what} {rest!r}: {w!r} is not KEY=VALUE")
        out.append((k, substitute(v, args)))
    return out


def config(dockerfile, overrides):
    args = {}
    cfg = {"User": None, "WorkingDir": None, "ExposedPorts": [], "Env": {}, "Entrypoint": None,
           "Cmd": None, "Labels": {}}
    for kw, rest in last_stage(open(dockerfile).read()):
        if kw == "ARG":
            name, _, default = rest.partition("=")
            args[name] = overrides.get(name, default.strip('"'))
        elif kw == "USER":
            cfg["User"] = substitute(rest, args)
        elif kw == "WORKDIR":
            cfg["WorkingDir"] = substitute(rest, args)
        elif kw == "EXPOSE":
            for p in rest.split():
                cfg["ExposedPorts"].append(p if "/" in p else p + "/tcp")
        elif kw == "ENV":
            cfg["Env"].update(pairs(rest, args, "ENV"))
        elif kw == "LABEL":
            cfg["Labels"].update(pairs(rest, args, "LABEL"))
        elif kw in ("CMD", "ENTRYPOINT"):
            try:
                v = json.loads(rest)
            except ValueError:
                v = None
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"{kw} {rest!r}: only the exec form [\"...\"] is supported")
            cfg["Cmd" if kw == "CMD" else "Entrypoint"] = v
    cfg["Env"].setdefault("PATH", DEFAULT_PATH)
    if cfg["User"] is None:
        raise ValueError("the last stage has no USER line")
    return cfg


def user_commands(dockerfile):
    """The groupadd/useradd commands of the last stage's RUN lines, in order."""
    out = []
    for kw, rest in last_stage(open(dockerfile).read()):
        if kw == "RUN":
            for part in re.split(r"&&|;", rest):
                part = " ".join(part.split())
                if part.startswith(("groupadd ", "useradd ")):
                    out.append(part)
    if [c.split()[0] for c in out] != ["groupadd", "useradd"]:
        raise ValueError(f"expected one groupadd then one useradd in RUN lines, found {out}")
    return out


def image_config(ref):
    """The config blob of tag TAG in OCI layout LAYOUT (ref = LAYOUT:TAG)."""
    layout, _, tag = ref.rpartition(":")
    blob = lambda d: json.load(open(f"{layout}/blobs/{d.replace(':', '/')}"))  # noqa: E731
    index = json.load(open(f"{layout}/index.json"))
    for m in index.get("manifests", []):
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return blob(blob(m["digest"])["config"]["digest"])
    raise ValueError(f"{layout}: no manifest tagged {tag!r}")


def check_image(cfg, ref):
    img = image_config(ref)
    c = img.get("config", {})
    env = dict(e.split("=", 1) for e in c.get("Env", []))
    got = {"User": c.get("User"), "WorkingDir": c.get("WorkingDir") or None,
           "ExposedPorts": sorted(c.get("ExposedPorts") or {}), "Env": env,
           "Entrypoint": c.get("Entrypoint") or None, "Cmd": c.get("Cmd") or None,
           "Labels": c.get("Labels") or {}}
    want = dict(cfg, ExposedPorts=sorted(cfg["ExposedPorts"]))
    errs = [f"config.{k}: image has {got[k]!r}, the Dockerfile says {want[k]!r}"
            for k in want if got[k] != want[k]]
    if img.get("os") != "linux":
        errs.append(f"os: {img.get('os')!r}, expected 'linux'")
    return errs


def umoci_args(cfg):
    out = ["--config.user", cfg["User"]]
    if cfg["WorkingDir"]:
        out += ["--config.workingdir", cfg["WorkingDir"]]
    for p in cfg["ExposedPorts"]:
        out += ["--config.exposedports", p]
    for k, v in cfg["Env"].items():
        out += ["--config.env", f"{k}={v}"]
    out += ["--clear", "config.entrypoint"]
    for a in cfg["Entrypoint"] or []:
        out += ["--config.entrypoint", a]
    out += ["--clear", "config.cmd"]
    for a in cfg["Cmd"] or []:
        out += ["--config.cmd", a]
    for k, v in cfg["Labels"].items():
        out += ["--config.label", f"{k}={v}"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dockerfile")
    ap.add_argument("--arg", action="append", default=[], help="NAME=VALUE overriding an ARG default")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--umoci", action="store_true")
    mode.add_argument("--json", action="store_true")
    mode.add_argument("--user-commands", action="store_true")
    mode.add_argument("--check-image", metavar="LAYOUT:TAG")
    a = ap.parse_args()
    overrides = dict(x.split("=", 1) for x in a.arg)
    try:
        cfg = config(a.dockerfile, overrides)
        if a.user_commands:
            print("\n".join(user_commands(a.dockerfile)))
            return 0
        if a.check_image:
            errs = check_image(cfg, a.check_image)
            for e in errs:
                print(f"dockerfile_config: {a.check_image}: {e}", file=sys.stderr)
            if not errs:
                print(f"dockerfile_config: {a.check_image}: config matches {a.dockerfile} "
                      f"(user {cfg['User']}, cmd {cfg['Cmd']}, {len(cfg['Labels'])} labels)")
            return 1 if errs else 0
    except (OSError, ValueError, KeyError) as e:
        print(f"dockerfile_config: {a.dockerfile}: {e}", file=sys.stderr)
        return 2
    if a.umoci:
        for w in umoci_args(cfg):
            if "\n" in w:
                print(f"dockerfile_config: newline in {w!r}", file=sys.stderr)
                return 2
            print(w)
    else:
        print(json.dumps(cfg, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
