#!/usr/bin/env bash
# Check the systemd units with `systemd-analyze verify` (CI runs this; it works as root without the unit's
# user or an installed binary). The units are templates (systemd/*.in, filled in at install time); they are
# written to a temporary directory with the default prefix /usr/local, and ExecStart= is pointed at a built
# car-inferenced when one exists (build*/daemon/car-inferenced), so verify checks the real path.
# Findings that only say the binary is not installed or the user does not exist on this machine are
# reported and tolerated; anything else fails. Also prints `systemd-analyze security` for the service.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v systemd-analyze >/dev/null; then
  echo "check-units: systemd-analyze not found (apt-get install systemd)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for unit in car-inferenced.service car-inferenced.socket car-inferenced-http.socket; do
  sed -e 's|@CAR_SBINDIR@|/usr/local/sbin|g' -e 's|@CAR_DOCDIR@|/usr/local/share/doc/car-inference|g' \
    "systemd/$unit.in" >"$tmp/$unit"
done
if grep -n '@[A-Z_]*@' "$tmp"/car-inferenced.*; then
  echo "check-units: FAILED - a template placeholder is left unfilled" >&2
  exit 1
fi
# The socket must outlive service restarts: the service may not own (and so delete) the socket's directory.
if grep -q '^RuntimeDirectory=' "$tmp/car-inferenced.service" &&
  ! grep -q '^RuntimeDirectoryPreserve=yes' "$tmp/car-inferenced.service"; then
  echo "check-units: FAILED - RuntimeDirectory= without RuntimeDirectoryPreserve=yes deletes the socket on restart" >&2
  exit 1
fi
sock=$(sed -n 's/^ListenStream=//p' "$tmp/car-inferenced.socket")
if ! grep -qx "Environment=CAR_INFERENCE_SOCKET=$sock" "$tmp/car-inferenced.service"; then
  echo "check-units: FAILED - the service's CAR_INFERENCE_SOCKET does not match ListenStream=$sock" >&2
  exit 1
fi
# The HTTP socket must reach the daemon under the name it adopts (daemon/systemd_notify.h: `http`).
if ! grep -qx 'FileDescriptorName=http' "$tmp/car-inferenced-http.socket" ||
  ! grep -qx 'Service=car-inferenced.service' "$tmp/car-inferenced-http.socket"; then
  echo "check-units: FAILED - car-inferenced-http.socket must name its fd http and its service car-inferenced.service" >&2
  exit 1
fi
binary=""
for b in build/daemon/car-inferenced build-*/daemon/car-inferenced; do
  if [ -x "$b" ]; then binary="$(cd "$(dirname "$b")" && pwd)/car-inferenced"; break; fi
done
if [ -n "$binary" ]; then
  sed -i "s|^ExecStart=/usr/local/sbin/car-inferenced|ExecStart=$binary|" "$tmp/car-inferenced.service"
  echo "check-units: ExecStart= pointed at $binary for the check"
fi

status=0
out=$(cd "$tmp" && systemd-analyze verify ./car-inferenced.socket ./car-inferenced-http.socket ./car-inferenced.service 2>&1) || status=$?
# Drop lines about things this machine does not have (the installed binary and man page, the car-inference
# user) and lines about the host's own units. scripts/check-package.sh verifies the installed units strictly.
unexpected=$(printf '%s\n' "$out" | grep -v -e '^$' \
  -e 'Command /usr/local/sbin/car-inferenced is not executable' \
  -e "Failed to resolve user 'car-inference'" -e "Failed to resolve group 'car-inference'" \
  -e 'car-inference: unknown group' -e 'car-inference: unknown user' \
  -e "Command 'man car-inferenced(8)' failed" \
  | grep -e 'car-inferenced' -e 'car-inference' || true)
if [ -n "$out" ]; then
  echo "check-units: systemd-analyze verify said:"
  printf '%s\n' "$out" | sed 's/^/  /'
fi
if [ -n "$unexpected" ]; then
  echo "check-units: FAILED - findings beyond a missing binary/user:" >&2
  printf '%s\n' "$unexpected" | sed 's/^/  /' >&2
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "check-units: verify exited $status only for a binary/user this machine lacks (tolerated)"
fi
echo "check-units: units verified"
score=$(cd "$tmp" && systemd-analyze security --offline=yes ./car-inferenced.service 2>/dev/null | grep -i 'overall exposure' || true)
[ -n "$score" ] && echo "check-units: ${score#→ }"
exit 0
