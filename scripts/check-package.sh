#!/usr/bin/env bash
# Build the Debian package from the README's build directory (build/, configured and built if missing: the
# binaries only), install it on this machine with apt, check what it installed, and remove it again:
#   car-inferenced --version, car --version, car --help, the car-inference user made by postinst from the
#   sysusers file, nothing enabled, the units' paths match the /usr prefix, `systemd-analyze verify` on the
#   installed units (when systemd-analyze exists); where systemd is PID 1, `car health` through the socket
#   unit before and after restarting and stopping the service (the socket must survive).
# Needs root (or sudo). Refuses to run when car-inference is already installed (it would remove it).
# CI runs it after the tests (.ci/run); it reuses build/, so it takes well under a minute there.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${CAR_PACKAGE_BUILD_DIR:-build}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
say() { echo "check-package: $*"; }
fail() { echo "check-package: FAILED - $*" >&2; exit 1; }

if dpkg-query -W -f='${Status}' car-inference 2>/dev/null | grep -q "install ok installed"; then
  fail "car-inference is already installed on this machine; remove it first (apt-get remove car-inference)"
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake -S . -B "$build" >/dev/null  # pick up install rules added since the last configure
cmake --build "$build" -j "$(nproc)" --target car car-inferenced car_man_pages
rm -rf "$build/package"
(cd "$build" && cpack -G DEB >/dev/null)
deb=$(ls "$build"/package/car-inference_*.deb)
deb=$(cd "$(dirname "$deb")" && pwd)/$(basename "$deb")
say "built $deb ($(du -h "$deb" | cut -f1))"
dpkg-deb -f "$deb" Package Version Architecture Depends | sed 's/^/  /'

installed=0
cleanup() {
  if [ "$installed" -eq 1 ]; then
    say "removing the package"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get purge -y -q car-inference >/dev/null || $SUDO dpkg --purge car-inference
  fi
}
trap cleanup EXIT
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "$deb" >/dev/null
installed=1
say "installed"

for f in /usr/bin/car /usr/sbin/car-inferenced /usr/lib/systemd/system/car-inferenced.service \
  /usr/lib/systemd/system/car-inferenced.socket /usr/lib/systemd/system/car-inferenced-http.socket \
  /usr/lib/sysusers.d/car-inference.conf \
  /usr/share/man/man1/car.1.gz /usr/share/man/man8/car-inferenced.8.gz \
  /usr/share/bash-completion/completions/car /usr/share/doc/car-inference/operations.md \
  /usr/share/doc/car-inference/car-inference.env.example /usr/share/doc/car-inference/LICENSE \
  /usr/share/doc/car-inference/copyright; do
  [ -e "$f" ] || fail "$f not installed"
done
# Debian policy: man pages gzipped (-n: reproducible), a machine-readable copyright file, a maintainer.
gzip -t /usr/share/man/man1/car.1.gz /usr/share/man/man8/car-inferenced.8.gz || fail "a man page is not valid gzip"
head -1 /usr/share/doc/car-inference/copyright |
  grep -qF "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/" ||
  fail "copyright is not in the machine-readable format"
maintainer=$(dpkg-deb -f "$deb" Maintainer)
printf '%s\n' "$maintainer" | grep -qE '^[^<]+ <[^>]+@[^>]+>$' || fail "Maintainer: '$maintainer' is not 'Name <address>'"
grep -q "car-inferenced-http.socket" /var/lib/dpkg/info/car-inference.prerm ||
  fail "prerm does not stop car-inferenced-http.socket"
/usr/sbin/car-inferenced --version | sed 's/^/  /'
/usr/bin/car --version | sed 's/^/  /'
/usr/sbin/car-inferenced --version | grep -q "^car-inferenced " || fail "car-inferenced --version"
/usr/bin/car --help | grep -q "Subcommands:" || fail "car --help lists no subcommands"
getent passwd car-inference >/dev/null || fail "postinst did not create the car-inference user"
getent group car-inference >/dev/null || fail "postinst did not create the car-inference group"
if ls /etc/systemd/system/*.wants/car-inferenced.* >/dev/null 2>&1; then
  fail "the package enabled a unit: $(ls /etc/systemd/system/*.wants/car-inferenced.*)"
fi
grep -qx "ExecStart=/usr/sbin/car-inferenced" /usr/lib/systemd/system/car-inferenced.service ||
  fail "ExecStart= does not point at /usr/sbin/car-inferenced"
grep -q "^Documentation=file:///usr/share/doc/car-inference/operations.md" /usr/lib/systemd/system/car-inferenced.service ||
  fail "Documentation= does not point at the installed docs"
if command -v systemd-analyze >/dev/null; then
  out=$(systemd-analyze verify /usr/lib/systemd/system/car-inferenced.socket \
    /usr/lib/systemd/system/car-inferenced.service 2>&1) || true
  # Lines about the host's own units are not ours; every finding about ours fails.
  ours=$(printf '%s\n' "$out" | grep -e 'car-inference' || true)
  [ -z "$out" ] || printf '%s\n' "$out" | sed 's/^/  verify: /'
  [ -z "$ours" ] || fail "systemd-analyze verify found problems in the installed units"
  say "systemd-analyze verify: installed units clean"
else
  say "systemd-analyze not found: unit verification skipped"
fi
if [ -d /run/systemd/system ]; then
  # systemd is PID 1: the socket must survive a service stop/start (the service owns no RuntimeDirectory=).
  $SUDO systemctl daemon-reload
  $SUDO systemctl start car-inferenced.socket
  $SUDO /usr/bin/car health --timeout 30 >/dev/null || fail "car health through the socket unit"
  $SUDO systemctl restart car-inferenced.service
  [ -S /run/car-inference/car-inference.sock ] || fail "the socket file is gone after a service restart"
  $SUDO /usr/bin/car health --timeout 30 >/dev/null || fail "car health after a service restart"
  $SUDO systemctl stop car-inferenced.service
  $SUDO /usr/bin/car health --timeout 30 >/dev/null || fail "car health after a service stop (socket activation)"
  $SUDO systemctl stop car-inferenced.service car-inferenced.socket
  say "systemd: socket kept and usable across service restart and stop"
else
  say "systemd is not PID 1 here: the service restart check skipped"
fi
say "ok"
