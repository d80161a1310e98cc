#!/usr/bin/python3
"""Drift checks for deploy/docker: the images must build the way the README does.

Asserts, without a Docker engine:
  * the CPU build stage runs `bash scripts/deps.sh` and the exact cmake configure line of
    scripts/demo.sh; the CUDA stage runs the same line with K3PD_CUDA=ON;
  * the CUDA stage installs only packages that scripts/deps.sh installs (plus binutils);
  * every runtime stage installs no compiler, CMake or -dev package, runs as a numeric
    non-root USER, and keeps RUNTIME_PKGS identical between its build-stage check and its
    install step;
  * every runtime stage's configuration parses with scripts/image/dockerfile_config.py (which
    scripts/image/build.sh uses to configure the image it writes without Docker) and carries
    the org.opencontainers.image title/version/revision labels; the CPU stage's
    groupadd/useradd lines are found (build.sh runs them in its rootfs).
Usage: check_dockerfiles.py REPO_ROOT
"""
import os
import re
import sys


def stages(text):
    """Splits a Dockerfile into (FROM line, body) per stage, with continuations joined."""
    text = re.sub(r"\\\n", " ", text)
    out, cur = [], None
    for line in text.splitlines():
        if line.startswith("FROM "):
            cur = [line, []]
            out.append(cur)
        elif cur is not None:
            cur[1].append(line)
    return [(f, "\n".join(b)) for f, b in out]


def main(root):
    errors = []
    demo = open(f"{root}/scripts/demo.sh").read()
    deps = open(f"{root}/scripts/deps.sh").read()
    m = re.search(r"^(cmake -S \. -B build .*?)\s*(>/dev/null)?$", demo, re.M)
    if not m:
        return ["scripts/demo.sh has no `cmake -S . -B build` configure line"]
    configure = m.group(1).strip()
    deps_pkgs = set(re.search(r"PKGS=\((.*?)\)", deps, re.S).group(1).split())
    for name, want_cfg, want_deps in (("Dockerfile", configure, True),
                                      ("Dockerfile.cuda",
                                       configure.replace("-DK3PD_CUDA=OFF", "-DK3PD_CUDA=ON"), False)):
        text = open(f"{root}/deploy/docker/{name}").read()
        st = stages(text)
        if len(st) < 2:
            errors.append(f"{name}: expected a build and a runtime stage")
            continue
        build, runtime = st[0][1], st[-1][1]
        if want_deps and "RUN bash scripts/deps.sh" not in build:
            errors.append(f"{name}: build stage does not run `bash scripts/deps.sh`")
        if want_cfg not in re.sub(r"\s+", " ", build):
            errors.append(f"{name}: build stage lacks the README configure line `{want_cfg}`")
        if "cmake --build build" not in build:
            errors.append(f"{name}: build stage lacks `cmake --build build`")
        if not want_deps:
            inst = re.search(r"apt-get install -y -qq --no-install-recommends (.*?)(&&|$)", build)
            extra = set(inst.group(1).split()) - deps_pkgs - {"binutils"} if inst else {"?"}
            if extra:
                errors.append(f"{name}: build stage installs packages deps.sh does not: {sorted(extra)}")
        pk = re.findall(r'ARG RUNTIME_PKGS="(.*?)"', text)
        if len(pk) != 2 or pk[0] != pk[1]:
            errors.append(f"{name}: RUNTIME_PKGS must be declared twice (check + install) and identical")
        for p in (pk[0].split() if pk else []):
            if p.endswith("-dev") or p in ("gcc", "g++", "cmake", "build-essential", "clang"):
                errors.append(f"{name}: runtime package {p} is a build tool")
        if "${RUNTIME_PKGS}" not in runtime:
            errors.append(f"{name}: runtime stage does not install ${{RUNTIME_PKGS}}")
        users = re.findall(r"^USER (\S+)", runtime, re.M)
        if not users or not re.fullmatch(r"[1-9]\d*:[1-9]\d*", users[-1]):
            errors.append(f"{name}: runtime stage must end with a numeric non-root USER uid:gid")
        if re.search(r"\b(build-essential|cmake|gcc|-dev)\b", runtime.replace("/dev/", "")):
            errors.append(f"{name}: runtime stage mentions build tools")
        if "COPY --from=build /out/bin/ /usr/local/bin/" not in runtime:
            errors.append(f"{name}: runtime stage does not copy the binaries to /usr/local/bin")
        try:
            cfg = dockerfile_config.config(f"{root}/deploy/docker/{name}", {})
            for label in ("title", "version", "revision"):
                if f"org.opencontainers.image.{label}" not in cfg["Labels"]:
                    errors.append(f"{name}: runtime stage lacks LABEL org.opencontainers.image.{label}")
            if want_deps:
                dockerfile_config.user_commands(f"{root}/deploy/docker/{name}")
        except ValueError as e:
            errors.append(f"{name}: scripts/image/dockerfile_config.py cannot read it: {e}")
    return errors


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(sys.argv[1], "scripts", "image"))
    import dockerfile_config  # noqa: E402
    errs = main(sys.argv[1])
    for e in errs:
        print(e)
    print("dockerfiles: OK" if not errs else f"dockerfiles: {len(errs)} problem(s)")
    sys.exit(1 if errs else 0)
