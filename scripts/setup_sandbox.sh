#!/usr/bin/env bash
# Installs what the code sandbox (`rollflash-sandbox`) needs: bubblewrap (`/usr/bin/bwrap`),
# util-linux's `prlimit` and a Python 3 under /usr. Idempotent: does nothing when they are
# present. Needs apt-get (Debian/Ubuntu) and root, or sudo, for what is missing; then checks
# that bubblewrap can create its namespaces here, which some containers forbid, and says so.
set -euo pipefail

need=()
[ -x /usr/bin/bwrap ] || need+=(bubblewrap)
[ -x /usr/bin/prlimit ] || need+=(util-linux)
[ -x /usr/bin/python3 ] || need+=(python3)

if [ "${#need[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_sandbox.sh: missing ${need[*]} and no apt-get to install them" >&2
    exit 2
  fi
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "setup_sandbox.sh: missing ${need[*]}; run as root to install them" >&2
      exit 2
    fi
  fi
  echo "setup_sandbox.sh: installing ${need[*]}" >&2
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >&2
fi

# The sandbox starts bwrap unprivileged (as nobody when run by root): check exactly that.
probe=(/usr/bin/bwrap --unshare-all --unshare-user --die-with-parent --ro-bind /usr /usr
  --symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin
  --proc /proc --dev /dev --tmpfs /tmp -- /usr/bin/python3 -c "print('ok')")
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null 2>&1; then
  probe=(setpriv --reuid 65534 --regid 65534 --clear-groups "${probe[@]}")
fi
if ! out="$("${probe[@]}" 2>&1)" || [ "$out" != "ok" ]; then
  echo "setup_sandbox.sh: bubblewrap is installed but cannot create namespaces here: $out" >&2
  exit 3
fi
echo "setup_sandbox.sh: bubblewrap works" >&2
