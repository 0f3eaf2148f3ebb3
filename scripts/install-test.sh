#!/usr/bin/env bash
# Issue 27: docs/OPERATIONS.md's install steps, run as written, in a scratch root directory.
#
# The ```sh blocks under "Install as a systemd service" and "Scheduled backups" are taken from
# the document itself and run with every absolute path they name (/etc, /usr/local, /var, /tmp)
# moved under a fresh $ROOT, and with the commands that would change this machine stubbed:
# `useradd` picks a free uid/gid and records the name (nothing is added to /etc/passwd), `install
# -o/-g` gets the numbers, `sudo -u crossbar` runs as that uid (setpriv), `sudoedit` makes the
# operator's edit (the sim's URL, free loopback ports), and `systemctl` does what systemd would
# with the installed units: creates StateDirectory=, runs ExecStartPre= and ExecStart= as User=,
# and for the backup timer runs the backup service once. Then it checks what the steps must give:
# modes and owners, a serving crossbar (/readyz), the unit's Documentation= file, a verified
# backup and the pruning of old ones. It also shows the two mistakes of the old order fail (a
# `check` as a user outside the group, a `check` before the state directory exists).
#
# Needs root (to run as another uid) and target/release/{crossbar,crossbar-sim}; builds them if
# missing. Touches nothing outside $ROOT; everything it starts is stopped and $ROOT removed.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
BIN="${CARGO_TARGET_DIR:-target}/release"
[[ $(id -u) -eq 0 ]] || { echo "install-test: needs root (runs steps as another uid)" >&2; exit 1; }
if [[ ! -x $BIN/crossbar || ! -x $BIN/crossbar-sim ]]; then
  cargo build --release --bins
fi
BIN=$(cd "$BIN" && pwd)

ROOT="$(mktemp -d "${TMPDIR:-/tmp}/crossbar-install.XXXXXX")"
chmod 0755 "$ROOT"
PIDS=()
cleanup() {
  local rc=$?
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$ROOT"
  exit "$rc"
}
trap cleanup EXIT INT TERM
say() { printf 'install-test: %s\n' "$*"; }
fail() { printf 'install-test: FAILED: %s\n' "$*" >&2; exit 1; }

# A free uid/gid for the service user, and one more for "an operator outside the group".
free_id() { local id=$1; while getent passwd "$id" >/dev/null || getent group "$id" >/dev/null; do id=$((id + 1)); done; echo "$id"; }
SVC_ID=$(free_id 61000)
OTHER_ID=$(free_id $((SVC_ID + 1)))

# The steps as the document writes them, paths moved under $ROOT.
block() { # $1: the heading the ```sh block follows
  awk -v h="$1" '$0 == h { on = 1; next } on && /^```sh$/ { inb = 1; next } inb && /^```$/ { exit } inb { print }' docs/OPERATIONS.md
}
rooted() { sed -E "s#(^|[ =\"])/(etc|usr/local|var|tmp)/#\1$ROOT/\2/#g"; }
INSTALL="$(block '## Install as a systemd service' | rooted)"
BACKUPS="$(block '### Scheduled backups' | rooted)"
[[ -n $INSTALL && -n $BACKUPS ]] || fail "the install blocks were not found in docs/OPERATIONS.md"

# What `scp` put in /tmp.
mkdir -p "$ROOT/tmp" "$ROOT/etc/systemd/system" "$ROOT/usr/local/bin" "$ROOT/var/lib" "$ROOT/var/backups"
cp "$BIN/crossbar" "$ROOT/tmp/crossbar"
cp deploy/crossbar.service deploy/crossbar-backup.service deploy/crossbar-backup.timer \
   docs/examples/two-plain-hosts.toml docs/OPERATIONS.md "$ROOT/tmp/"

# A host for the config: a simulated llama-server.
"$BIN/crossbar-sim" --listen 127.0.0.1:0 --alias qwen-coder >"$ROOT/sim.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do grep -q '^sim listening on ' "$ROOT/sim.out" && break; sleep 0.05; done
SIM_URL=$(sed -n 's/^sim listening on //p' "$ROOT/sim.out")
[[ -n $SIM_URL ]] || fail "crossbar-sim did not start"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
LISTEN=$(free_port); ADMIN=$(free_port)

# --- the stubs -------------------------------------------------------------------------------
ids() { case $1 in root|0) echo 0 ;; crossbar) [[ -f $ROOT/.user ]] && echo "$SVC_ID" || echo "no-such-user:$1" ;; *) echo "$1" ;; esac; }
useradd() { [[ ${*: -1} == crossbar ]] || fail "useradd of ${*: -1}"; touch "$ROOT/.user"; }
install() {
  local args=() a
  while (($#)); do
    a=$1; shift
    case $a in -o|-g) args+=("$a" "$(ids "$1")"); shift ;; *) args+=("$a") ;; esac
  done
  command install "${args[@]}"
}
as_user() { local id; id=$(ids "$1"); shift; setpriv --reuid="$id" --regid="$id" --clear-groups -- "$@"; }
sudo() {
  if [[ $1 == -u ]]; then local user=$2; shift 2
    case $1 in crossbar) shift; as_user "$user" "$ROOT/usr/local/bin/crossbar" "$@" ;; *) as_user "$user" "$@" ;; esac
  else "$@"; fi
}
sudoedit() { # the operator's edit: this machine's host and free loopback ports; db kept
  sed -i -E -e "s#^url *= *\"[^\"]*\"#url = \"$SIM_URL\"#" \
    -e "s#^listen *= .*#listen = \"127.0.0.1:$LISTEN\"#" -e "s#^admin_listen *= .*#admin_listen = \"127.0.0.1:$ADMIN\"#" \
    -e "s#\"/var/lib/crossbar/#\"$ROOT/var/lib/crossbar/#" "$1"
}
unit_key() { sed -n "s/^$2=//p" "$ROOT/etc/systemd/system/$1" | rooted; }
run_exec() { # $1 unit, $2 key: runs that Exec line as the unit's User=, as systemd would
  local unit=$1 line
  line=$(unit_key "$unit" "$2" | sed -e 's/%%/%/g' -e 's/\$\$/$/g')
  [[ -n $line ]] || return 0
  # No globbing: systemd passes `crossbar-*.db` to find as it is.
  set -f; eval "as_user $(unit_key "$unit" User) $line"; local rc=$?; set +f
  return $rc
}
state_dir() { # StateDirectory=: created if missing, given to the unit's user
  local dir; dir="$ROOT/var/lib/$(unit_key "$1" StateDirectory)"
  command install -d -m 0750 "$dir"; chown "$(ids "$(unit_key "$1" User)")":"$(ids "$(unit_key "$1" Group)")" "$dir"
}
systemctl() {
  case "$*" in
    daemon-reload) for u in "$ROOT"/etc/systemd/system/*; do [[ -f $u ]] || fail "no unit $u"; done ;;
    "enable --now crossbar")
      state_dir crossbar.service
      run_exec crossbar.service ExecStartPre || fail "ExecStartPre (crossbar check) failed"
      # WorkingDirectory=, User=; exec, so that $! is crossbar itself.
      local id line; id=$(ids "$(unit_key crossbar.service User)"); line=$(unit_key crossbar.service ExecStart)
      (cd "$(unit_key crossbar.service WorkingDirectory)" &&
        eval "exec setpriv --reuid=$id --regid=$id --clear-groups -- $line") 2>"$ROOT/journal" &
      PIDS+=($!); SERVE_PID=$! ;;
    "enable --now crossbar-backup.timer")
      [[ -f $ROOT/etc/systemd/system/crossbar-backup.timer ]] || fail "the timer is not installed"
      state_dir crossbar-backup.service
      run_exec crossbar-backup.service ExecStart || fail "the backup service's ExecStart failed"
      run_exec crossbar-backup.service ExecStartPost || fail "the backup service's pruning failed" ;;
    *) fail "systemctl $*: not simulated" ;;
  esac
}
journalctl() { for _ in $(seq 1 100); do grep -q 'crossbar listening' "$ROOT/journal" 2>/dev/null && break; sleep 0.05; done; cat "$ROOT/journal"; }

# --- the old order's two mistakes fail -------------------------------------------------------
say "the steps, from docs/OPERATIONS.md:"; sed 's/^/    /' <<<"$INSTALL"
# Run up to the check, minus the state directory: the check must refuse.
PRE=$(sed -n '1,/sudoedit/p' <<<"$INSTALL")
eval "$PRE"
if out=$(sudo -u crossbar crossbar check -c "$ROOT/etc/crossbar/crossbar.toml" 2>&1); then
  fail "check passed before the state directory existed: $out"
fi
grep -q "is not writable" <<<"$out" || fail "check before the state directory: $out"
say "a check before /var/lib/crossbar exists fails as it should: $out"
if out=$(as_user "$OTHER_ID" "$ROOT/usr/local/bin/crossbar" check -c "$ROOT/etc/crossbar/crossbar.toml" 2>&1); then
  fail "a user outside the group read the 0640 config"
fi
say "a check as a user outside the group fails as it should: $out"
rm -rf "$ROOT/etc/crossbar" "$ROOT/usr/local/bin/crossbar" "$ROOT/usr/local/share" "$ROOT/.user"

# --- the steps as written --------------------------------------------------------------------
START=$(date +%s.%N)
eval "$INSTALL" >"$ROOT/steps.out" 2>&1 || { cat "$ROOT/steps.out"; fail "the install steps"; }
grep -q '^ok$' "$ROOT/steps.out" || { cat "$ROOT/steps.out"; fail "crossbar check did not print ok"; }
grep -q 'crossbar listening' "$ROOT/steps.out" || { cat "$ROOT/steps.out"; fail "crossbar did not start"; }
mode() { stat -c '%a %u:%g' "$1"; }
[[ $(mode "$ROOT/etc/crossbar/crossbar.toml") == "640 0:$SVC_ID" ]] || fail "config: $(mode "$ROOT/etc/crossbar/crossbar.toml")"
[[ $(mode "$ROOT/var/lib/crossbar") == "750 $SVC_ID:$SVC_ID" ]] || fail "state dir: $(mode "$ROOT/var/lib/crossbar")"
DOC=$(sed -n 's#^Documentation=file://##p' "$ROOT/etc/systemd/system/crossbar.service" | rooted)
[[ -f $DOC ]] || fail "the unit's Documentation= names $DOC, which the steps did not install"
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "http://127.0.0.1:$ADMIN/readyz" || fail "/readyz"
echo
curl -fsS "http://127.0.0.1:$LISTEN/projA/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"installed?"}],"max_tokens":4}' >/dev/null || fail "a request through the installed crossbar"
[[ $(stat -c %u "$ROOT/var/lib/crossbar/crossbar.db") == "$SVC_ID" ]] || fail "the db is not the service user's"
say "installed and serving as uid $SVC_ID: config 0640 root:crossbar, db in $ROOT/var/lib/crossbar, Documentation= exists"

# --- scheduled backups -----------------------------------------------------------------------
say "the backup steps:"; sed 's/^/    /' <<<"$BACKUPS"
OLD="$ROOT/var/backups/crossbar/crossbar-20000101T000000Z.db"
mkdir -p "$ROOT/var/backups/crossbar"; touch -d '20 days ago' "$OLD"
eval "$BACKUPS" >"$ROOT/backup.out" 2>&1 || { cat "$ROOT/backup.out"; fail "the backup steps"; }
grep -q '^backup ok: ' "$ROOT/backup.out" || { cat "$ROOT/backup.out"; fail "no verified backup"; }
NEW=$(ls "$ROOT"/var/backups/crossbar/crossbar-2*.db | grep -v 20000101 || true)
[[ -n $NEW ]] || fail "no new copy in /var/backups/crossbar"
[[ ! -e $OLD ]] || fail "a copy 20 days old was not pruned"
say "$(cat "$ROOT/backup.out"); a 20-day-old copy pruned"

kill -TERM "$SERVE_PID"; wait "$SERVE_PID" || fail "crossbar did not exit 0 on SIGTERM"
tail -n 1 "$ROOT/journal" | grep -q 'stopped' || fail "the last line is not stopped"
say "ok in $(awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s"
