#!/usr/bin/env python3
"""Renders one stage of deploy/Dockerfile as bash for deploy/chroot-check.sh, so that the chroot runs
the Dockerfile's own steps rather than a copy of them that could drift.

  dockerfile_steps.py DOCKERFILE STAGE [NAME=VALUE ...]     (NAME=VALUE: like --build-arg)

The output expects $ROOT (the stage's root directory) and the shell functions copy_context (COPY .
DEST) and copy_from (COPY --from=STAGE SRC DEST) from chroot-check.sh. ARG and ENV become exports
in $ROOT/.stage-env, WORKDIR a `cd` there; each RUN runs in `chroot $ROOT` with that environment
under `bash -o pipefail -c` (the Dockerfile's SHELL), timed. USER is recorded in $ROOT/.stage-user;
EXPOSE, HEALTHCHECK, STOPSIGNAL, ENTRYPOINT and CMD are printed as comments (the caller starts the
server itself).
"""
import re
import shlex
import sys


def instructions(text):
    """(keyword, argument text) in order; continuation lines joined as Docker does."""
    out, cur = [], None
    for line in text.splitlines():
        if cur is None:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            cur = line
        elif line.lstrip().startswith("#"):  # comment lines inside a continuation are dropped
            continue
        else:
            cur += "\n" + line
        if cur.endswith("\\"):
            continue
        kw, _, rest = cur.strip().partition(" ")
        out.append((kw.upper(), rest.strip()))
        cur = None
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    dockerfile, stage = sys.argv[1], sys.argv[2]
    overrides = dict(a.split("=", 1) for a in sys.argv[3:])
    ins = instructions(open(dockerfile).read())
    q = shlex.quote
    lines = ['printf \'%s\\n\' "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" '
             '"export HOME=/root" > "$ROOT/.stage-env"']
    in_stage, n = False, 0
    for kw, arg in ins:
        if kw == "FROM":
            m = re.match(r"(\S+)\s+AS\s+(\S+)", arg, re.I)
            in_stage = bool(m) and m.group(2) == stage
            if in_stage:
                # ARGs before the first FROM only parametrise FROM lines; a stage does not see them.
                lines.append(f"# FROM {arg}")
            continue
        if not in_stage:
            continue
        if kw == "ARG":
            k, eq, v = arg.partition("=")
            v = overrides.get(k, v[1:-1] if v.startswith('"') and v.endswith('"') else v)
            if not eq and k not in overrides:
                continue
            lines.append(f"echo {q('export ' + k + '=' + q(v))} >> \"$ROOT/.stage-env\"")
        elif kw == "ENV":
            for pair in shlex.split(arg.replace("\\\n", " ")):
                k, _, v = pair.partition("=")
                # Expanded inside the chroot, like Docker's ${VAR} (values here have no spaces).
                lines.append(f"echo {q('export ' + k + '=' + chr(34) + v + chr(34))} >> \"$ROOT/.stage-env\"")
        elif kw == "WORKDIR":
            lines.append(f"mkdir -p \"$ROOT\"{q(arg)}")
            lines.append(f"echo {q('cd ' + arg)} >> \"$ROOT/.stage-env\"")
        elif kw == "SHELL":
            lines.append(f"# SHELL {arg} (each RUN uses bash -o pipefail -c)")
        elif kw == "COPY":
            parts = arg.split()
            if parts[0].startswith("--from="):
                lines.append(f"copy_from {q(parts[0][7:])} {q(parts[1])} {q(parts[2])}")
            elif parts[0] == ".":
                lines.append(f"copy_context {q(parts[1])}")
            else:
                sys.exit(f"unsupported COPY {arg}")
        elif kw == "RUN":
            n += 1
            first = arg.splitlines()[0].rstrip(' \\')[:90]
            lines.append(f"run_step {q(stage + ' RUN ' + str(n) + ': ' + first)} {q(arg)}")
        elif kw == "USER":
            lines.append(f"echo {q(arg)} > \"$ROOT/.stage-user\"")
        else:
            lines.append("# " + kw + " " + arg.replace("\n", "\n# "))
    if n == 0:
        sys.exit(f"no stage {stage!r} with RUN steps in {dockerfile}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
