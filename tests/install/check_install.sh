#!/usr/bin/env bash
# ctest InstallTree.*: `cmake --install BUILD --prefix TMP` puts every file in place, the units name the
# prefix's binary and docs, and the bash completion completes car's commands and options from the built
# binary. Usage: check_install.sh BUILD_DIR
set -euo pipefail
build=$1
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
fail() { echo "FAILED: $*" >&2; exit 1; }
for f in bin/car sbin/car-inferenced lib/systemd/system/car-inferenced.service \
  lib/systemd/system/car-inferenced.socket lib/sysusers.d/car-inference.conf share/man/man1/car.1.gz \
  share/man/man8/car-inferenced.8.gz share/bash-completion/completions/car \
  share/bash-completion/completions/car-inferenced share/doc/car-inference/car-inference.env.example \
  share/doc/car-inference/operations.md share/doc/car-inference/LICENSE share/doc/car-inference/copyright; do
  [ -e "$prefix/$f" ] || fail "$f not installed"
done
unit=$prefix/lib/systemd/system/car-inferenced.service
grep -qx "ExecStart=$prefix/sbin/car-inferenced" "$unit" || fail "ExecStart= is not the installed binary: $(grep ExecStart= "$unit")"
for u in "$unit" "$prefix/lib/systemd/system/car-inferenced.socket"; do
  grep -q "^Documentation=file://$prefix/share/doc/car-inference/operations.md" "$u" || fail "Documentation= in $u"
done
if grep -n '@[A-Z_]*@' "$prefix"/lib/systemd/system/*; then fail "unfilled template placeholder"; fi
grep -q '^RuntimeDirectory=' "$unit" && fail "the service owns RuntimeDirectory= (deletes the socket on restart)"
grep -q '^After=.*network.target' "$unit" && fail "After=network.target with PrivateNetwork=yes"
grep -q '^LimitNOFILE=' "$unit" || fail "no LimitNOFILE="
"$prefix/sbin/car-inferenced" --version | grep -q '^car-inferenced ' || fail "installed car-inferenced --version"

# Completion, against the installed car.
# shellcheck disable=SC1091
source "$prefix/share/bash-completion/completions/car"
PATH=$prefix/bin:$prefix/sbin:$PATH
COMP_WORDS=(car he); COMP_CWORD=1; _car
[ "${COMPREPLY[*]}" = "health" ] || fail "car he<TAB> gave '${COMPREPLY[*]}'"
COMP_WORDS=(car gguf ""); COMP_CWORD=2; _car
[[ " ${COMPREPLY[*]} " == *" inspect "* ]] || fail "car gguf <TAB> gave '${COMPREPLY[*]}'"
COMP_WORDS=(car health --so); COMP_CWORD=2; _car
[ "${COMPREPLY[*]}" = "--socket" ] || fail "car health --so<TAB> gave '${COMPREPLY[*]}'"
COMP_WORDS=(car-inferenced --models); COMP_CWORD=1; _car_inferenced
[ "${COMPREPLY[*]}" = "--models-dir" ] || fail "car-inferenced --models<TAB> gave '${COMPREPLY[*]}'"
echo "install tree ok"
