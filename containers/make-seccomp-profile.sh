#!/bin/sh
# containers/make-seccomp-profile.sh — write seccomp-io_uring.json: podman's
# default seccomp profile with io_uring allowed. Docker (25.0 and later)
# blocks io_uring in its default profile the same way and reads the same
# format, so "docker run --security-opt seccomp=..." takes this file too.
#
#   containers/make-seccomp-profile.sh [DEFAULT_PROFILE [OUTPUT]]
#
# DEFAULT_PROFILE defaults to /usr/share/containers/seccomp.json (Debian's
# golang-github-containers-common; 0.50.1 made the shipped file). The script
# adds io_uring_setup, io_uring_enter and io_uring_register to the profile's
# unconditional allow list (the SCMP_ACT_ALLOW entry without argument or
# capability conditions) and changes nothing else; the default profile does
# not name them at all, so they fall to its defaultAction (ENOSYS).
#
# Why the default blocks io_uring: io_uring has had kernel bugs that seccomp
# cannot filter (its operations do not go through system calls). Allowing
# it for ravnestd trades that for the faster transport; without the profile
# the daemon falls back to epoll and works all the same.
set -eu
in=${1:-/usr/share/containers/seccomp.json}
out=${2:-$(dirname "$0")/seccomp-io_uring.json}
py=/usr/bin/python3
[ -x "$py" ] || py=python3
"$py" - "$in" "$out" <<'PY'
import json, sys
src, dst = sys.argv[1], sys.argv[2]
with open(src) as f:
    profile = json.load(f)
wanted = ["io_uring_enter", "io_uring_register", "io_uring_setup"]
allow = [s for s in profile["syscalls"]
         if s.get("action") == "SCMP_ACT_ALLOW" and not s.get("args")
         and not s.get("includes") and not s.get("excludes")]
if not allow:
    sys.exit(f"{src}: no unconditional SCMP_ACT_ALLOW entry")
entry = max(allow, key=lambda s: len(s["names"]))
entry["names"] = sorted(set(entry["names"]) | set(wanted))
with open(dst, "w") as f:
    f.write(json.dumps(profile, indent="\t") + "\n")
print(f"{dst}: {src} with {', '.join(wanted)} allowed")
PY
