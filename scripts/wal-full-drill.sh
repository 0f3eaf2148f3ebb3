#!/usr/bin/env bash
# `make drill-wal` (issue 24, "A bounded WAL"): the disk-full recovery, with the WAL's own growth
# as the filler. Run as root: it mounts a small tmpfs (8 MiB by default, DRILL_TMPFS) for the db.
#
# One `crossbar-sim` host and a real `crossbar serve` whose db is on that tmpfs, on loopback only.
# A python3 sqlite3 connection holds a read transaction open on the db (the one thing that keeps the
# WAL from being reset, docs/OPERATIONS.md "Bounded state"), and keep-alive clients flood new
# conversations (each its own X-Session-Id: a lease and a row) until crossbar answers 503
# `store unavailable`. Then the reader ends and new conversations are sent until they are served
# again and /admin/status says the store is ok. It prints the figures and exits non-zero if crossbar
# died or did not recover within DRILL_RECOVER_S seconds (default 30). Everything it starts is
# stopped, the tmpfs unmounted and its temp dir removed, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "$(id -u)" != 0 ]]; then
  echo "wal-full-drill: skipped: needs root to mount a tmpfs (run it as root)"
  exit 0
fi

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
BIN="$TARGET_DIR/release"
SIZE="${DRILL_TMPFS:-24m}"
RECOVER_S="${DRILL_RECOVER_S:-30}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/crossbar-wal-drill.XXXXXX")"
FS="$WORK/fs"
MOUNTED=""
SIM_PID=""
CROSSBAR_PID=""

cleanup() {
  local rc=$?
  if [[ -n "$CROSSBAR_PID" ]] && kill -0 "$CROSSBAR_PID" 2>/dev/null; then
    kill -TERM "$CROSSBAR_PID" 2>/dev/null || true
    wait "$CROSSBAR_PID" 2>/dev/null || true
  fi
  if [[ -s "$WORK/restarted.pid" ]]; then
    kill -TERM "$(cat "$WORK/restarted.pid")" 2>/dev/null || true
    sleep 1
  fi
  if [[ -n "$SIM_PID" ]]; then
    kill "$SIM_PID" 2>/dev/null || true
    wait "$SIM_PID" 2>/dev/null || true
  fi
  if [[ -n "$MOUNTED" ]]; then
    umount "$FS" 2>/dev/null || umount -l "$FS" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT INT TERM

mkdir "$FS"
if ! mount -t tmpfs -o "size=$SIZE,mode=0700" tmpfs "$FS" 2>"$WORK/mount.err"; then
  echo "wal-full-drill: skipped: cannot mount a tmpfs here ($(tr '\n' ' ' <"$WORK/mount.err"))"
  exit 0
fi
MOUNTED=1

if [[ ! -x "$BIN/crossbar" || ! -x "$BIN/crossbar-sim" ]]; then
  echo "wal-full-drill: building the release binaries"
  nice -n 10 cargo build --release --bins
fi

NAME=wal-full-drill
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

# No simulated cost: the drill is about the store, so requests should be as cheap as they come.
"$BIN/crossbar-sim" --listen 127.0.0.1:0 --alias m --ctx 65536 --slots 8 --max-tokens 1 \
  >"$WORK/sim.out" 2>&1 &
SIM_PID=$!
SIM_URL="$(wait_line "$WORK/sim.out" '^sim listening on ' | sed -e 's/^sim listening on //')"

DB="$FS/crossbar.db"
CFG="$WORK/crossbar.toml"
cat >"$CFG" <<EOF
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
db = "$DB"
workers = 8
health_interval = "1s"
shutdown_grace = "2s"

[hosts.sim]
url = "$SIM_URL"
[hosts.sim.models.m]
parallel = 8

[routes.drill]
hosts = ["sim"]
model = "m"
EOF
"$BIN/crossbar" check -c "$CFG" >/dev/null

# The log stays off the tmpfs: the WAL is the only filler.
"$BIN/crossbar" serve -c "$CFG" 2>"$WORK/crossbar.log" &
CROSSBAR_PID=$!
LISTENING="$(wait_line "$WORK/crossbar.log" 'crossbar listening clients=')"
GW="$(sed -E 's/.*clients=([^ ]+).*/\1/' <<<"$LISTENING")"
ADMIN="$(sed -E 's/.*admin=([^ ]+).*/\1/' <<<"$LISTENING")"
case "$GW $ADMIN" in
  127.0.0.1:*" "127.0.0.1:*) ;;
  *) echo "wal-full-drill: crossbar is not on loopback: $LISTENING" >&2; exit 1 ;;
esac
echo "wal-full-drill: tmpfs $SIZE at $FS, sim $SIM_URL, crossbar clients=$GW admin=$ADMIN"

set +e
python3 - "$GW" "$ADMIN" "$DB" "$CROSSBAR_PID" "$WORK/crossbar.log" "$RECOVER_S" \
  "$BIN/crossbar" "$CFG" "$WORK" <<'PY'
import http.client, json, os, signal, sqlite3, subprocess, sys, threading, time

gw, admin, db, pid, log_path, recover_s, binary, cfg, work = sys.argv[1:10]
pid, recover_s = int(pid), float(recover_s)
wal = db + "-wal"
fs = os.path.dirname(db)
MiB = 1 << 20
BODY = json.dumps({"model": "m", "max_tokens": 1,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()


def conn(addr):
    host, port = addr.rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=40)


def chat(c, session):
    """One chat turn on keep-alive connection c: (status, error code or None)."""
    c.request("POST", "/drill/v1/chat/completions", body=BODY,
              headers={"Content-Type": "application/json", "X-Session-Id": session})
    r = c.getresponse()
    data = r.read()
    code = None
    if r.status != 200:
        try:
            err = json.loads(data).get("error")
            code = err.get("code") if isinstance(err, dict) else None
        except ValueError:
            pass
    return r.status, code


def one(session):
    c = conn(gw)
    try:
        return chat(c, session)
    finally:
        c.close()


def store():
    c = conn(admin)
    try:
        c.request("GET", "/admin/status")
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            return {"ok": None, "error": f"admin {r.status}: {body[:200]!r}"}
        return json.loads(body)["store"]
    finally:
        c.close()


def wal_size():
    try:
        return os.stat(wal).st_size
    except FileNotFoundError:
        return 0


def free():
    s = os.statvfs(fs)
    return s.f_bavail * s.f_frsize


def alive():
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def first_cause():
    """The cause named by the log's first `store failing` line."""
    with open(log_path, errors="replace") as f:
        for line in f:
            if "store failing" in line and "cause=" in line:
                return line.split("cause=", 1)[1].split(" hint=", 1)[0]
    return None


def log_count(needle):
    with open(log_path, errors="replace") as f:
        return sum(needle in line for line in f)


def mib(n):
    return f"{n / MiB:.2f} MiB"


problems = []
fig = {}

# Conversations with a lease before the disk fills.
warm = [f"warm-{i}" for i in range(3)]
for s in warm:
    st, _ = one(s)
    if st != 200:
        sys.exit(f"drill: warm-up conversation {s} answered {st}")
fig["db_start"] = os.stat(db).st_size
# crossbar keeps 8 MiB in reserve beside the db, taken once writes have gone through for 60 s.
reserve = db + "-reserve"
t_reserve = time.monotonic()
while not (os.path.exists(reserve) and os.stat(reserve).st_size == 8 * MiB):
    if time.monotonic() - t_reserve > 120:
        sys.exit("drill: crossbar took no 8 MiB reserve beside the db within 120 s")
    time.sleep(0.5)
fig["reserve_s"] = time.monotonic() - t_reserve
fig["free_start"] = free()

def pin():
    """The long reader: a read transaction that stays open pins the WAL (no checkpoint past
    its snapshot, no reset)."""
    reader = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM leases").fetchone()
    return reader


reader = pin()

# Flood: new conversations until the first 503 store unavailable.
lock = threading.Lock()
stop = threading.Event()
state = {"n": 0, "ok": 0, "other": {}, "first_503": None, "wal_at_503": None,
         "free_at_503": None, "t_503": None, "max_s": 0.0, "slow": 0}
t_flood = time.monotonic()
FLOOD_DEADLINE = 120


def flooder(k):
    c = conn(gw)
    i = 0
    while not stop.is_set():
        if time.monotonic() - t_flood > FLOOD_DEADLINE:
            stop.set()
            break
        with lock:
            state["n"] += 1
            n = state["n"]
        t_req = time.monotonic()
        try:
            st, code = chat(c, f"flood-{k}-{i}")
        except (OSError, http.client.HTTPException) as e:
            c.close()
            c = conn(gw)
            st, code = -1, type(e).__name__
        i += 1
        took = time.monotonic() - t_req
        with lock:
            state["max_s"] = max(state["max_s"], took)
            state["slow"] += took > 1.0
            if st == 200:
                state["ok"] += 1
            elif st == 503 and code == "store unavailable":
                if state["first_503"] is None:
                    state["first_503"] = n
                    state["t_503"] = time.monotonic() - t_flood
                    state["wal_at_503"] = wal_size()
                    state["free_at_503"] = free()
                stop.set()
            else:
                key = f"{st} {code}"
                state["other"][key] = state["other"].get(key, 0) + 1
    c.close()


threads = [threading.Thread(target=flooder, args=(k,)) for k in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
if state["first_503"] is None:
    print(f"drill: no 503 store unavailable within {FLOOD_DEADLINE} s "
          f"({state['ok']} served, others {state['other']}, WAL {mib(wal_size())}, "
          f"free {free()} B)")
    sys.exit(1)
fig.update(state)
fig["store_full"] = store()
fig["warm"] = [one(s)[0] for s in warm]
fig["new_while_full"] = [one(f"full-{i}")[0] for i in range(5)]
fig["failing_lines_full"] = log_count("store failing")
fig["first_cause"] = first_cause()
if fig["store_full"].get("ok") is not False:
    problems.append(f"/admin/status said store {fig['store_full']} while full")
if any(s != 200 for s in fig["warm"]):
    problems.append(f"conversations with a lease were not served while full: {fig['warm']}")

# The reader ends: crossbar should take new conversations again on its own.
reader.rollback()
reader.close()
t0 = time.monotonic()
first_200 = None
store_ok = None
sent = 0
statuses = {}
c = conn(gw)
while time.monotonic() - t0 < recover_s:
    st, _ = chat(c, f"after-{sent}")
    sent += 1
    statuses[st] = statuses.get(st, 0) + 1
    if st == 200 and first_200 is None:
        first_200 = time.monotonic() - t0
    if first_200 is not None and store().get("ok") is True:
        store_ok = time.monotonic() - t0
        break
    time.sleep(0.02 if first_200 is not None else 0.1)
c.close()
fig["recover_sent"] = sent
fig["recover_statuses"] = statuses
fig["first_200_s"] = first_200
fig["store_ok_s"] = store_ok
fig["wal_recover"] = wal_size()
time.sleep(1.0)  # a few checkpoint ticks
fig["wal_after"] = wal_size()
fig["db_after"] = os.stat(db).st_size
fig["free_after"] = free()
fig["store_after"] = store()
# Still serving after the recovery: a handful more new conversations.
fig["new_after"] = [one(f"later-{i}")[0] for i in range(10)]
fig["failing_lines"] = log_count("store failing")
fig["recovered_lines"] = log_count("store recovered")
fig["alive"] = alive()

if first_200 is None:
    problems.append(f"no new conversation served within {recover_s:.0f} s of the reader's end "
                    f"({sent} sent: {statuses})")
elif store_ok is None:
    problems.append(f"/admin/status store not ok within {recover_s:.0f} s: {store()}")
if any(s != 200 for s in fig["new_after"]):
    problems.append(f"new conversations after recovery: {fig['new_after']}")
if not fig["alive"]:
    problems.append("crossbar died")
failed_requests = (fig["first_503"] is not None) + len(fig["new_while_full"]) + \
    statuses.get(503, 0)
if fig["failing_lines"] == 0:
    problems.append("no `store failing` line in the log")
elif fig["failing_lines"] > 5:
    problems.append(f"`store failing` logged {fig['failing_lines']} times "
                    f"for {failed_requests} refused requests (once per burst expected)")

cause = fig["store_full"].get("cause", "")
print()
print("wal-full-drill summary")
print(f"  reserve        8 MiB taken {fig['reserve_s']:.0f} s after the first writes")
print(f"  flood          {fig['ok']} new conversations served, first 503 store unavailable at "
      f"request {fig['first_503']} after {fig['t_503']:.1f} s"
      + (f" (other answers: {fig['other']})" if fig["other"] else "")
      + f"; slowest answer {fig['max_s']:.2f} s, {fig['slow']} over 1 s")
print(f"  when full      WAL {mib(fig['wal_at_503'])} (db {mib(fig['db_start'])} at start), "
      f"free {fig['free_at_503']} B of the tmpfs; /admin/status store ok="
      f"{fig['store_full'].get('ok')} cause={cause!r}; the log's first cause {fig['first_cause']}")
print(f"  while full     leased conversations {fig['warm']}, new ones {fig['new_while_full']}")
if first_200 is not None:
    print(f"  recovery       first 200 {first_200:.2f} s after the reader ended, store ok "
          + (f"{store_ok:.2f} s" if store_ok is not None else "never")
          + f" ({sent} sent: {statuses})")
else:
    print(f"  recovery       none within {recover_s:.0f} s ({sent} sent: {statuses})")
print(f"  after          WAL {mib(fig['wal_recover'])} at recovery, {mib(fig['wal_after'])} 1 s "
      f"later; db {mib(fig['db_after'])}, free {mib(fig['free_after'])}; store ok="
      f"{fig['store_after'].get('ok')}; 10 more new conversations {sorted(set(fig['new_after']))}")
print(f"  log            `store failing` x{fig['failing_lines']} (x{fig['failing_lines_full']} "
      f"while full), `store recovered` x{fig['recovered_lines']}, for {failed_requests} "
      f"refused requests")
print(f"  crossbar       {'alive' if fig['alive'] else 'DEAD'}")
if problems:
    print("wal-full-drill: FAILED")
    for p in problems:
        print(f"  - {p}")
    sys.exit(1)

# A restart on the full disk: once the reserve is taken again (writes have gone through for 60 s),
# the disk is filled again the same way, crossbar is stopped with the reader still open, and started
# again once the reader has ended. Before the reserve, crossbar refused to start there ("database
# or disk is full").
t_reserve = time.monotonic()
while not (os.path.exists(reserve) and os.stat(reserve).st_size == 8 * MiB):
    one(f"settle-{time.monotonic()}")
    if time.monotonic() - t_reserve > 120:
        print("wal-full-drill: FAILED: the reserve was not taken again within 120 s")
        sys.exit(1)
    time.sleep(0.5)
print(f"  reserve again  taken {time.monotonic() - t_reserve:.0f} s after the recovery")
reader = pin()
state.update({"first_503": None, "n": 0})
stop.clear()
t_flood = time.monotonic()
threads = [threading.Thread(target=flooder, args=(k,)) for k in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
fig["refull_503"] = state["first_503"]
os.kill(pid, signal.SIGTERM)
t_stop = time.monotonic()
while alive() and time.monotonic() - t_stop < 15:
    time.sleep(0.05)
reader.rollback()
reader.close()
log2 = os.path.join(work, "crossbar-2.log")
proc = subprocess.Popen([binary, "serve", "-c", cfg], stderr=open(log2, "w"))
with open(os.path.join(work, "restarted.pid"), "w") as f:
    f.write(str(proc.pid))
gw2 = None
t_start = time.monotonic()
while gw2 is None and proc.poll() is None and time.monotonic() - t_start < 15:
    with open(log2, errors="replace") as f:
        for line in f:
            if "crossbar listening clients=" in line:
                gw2 = line.split("clients=", 1)[1].split()[0]
    time.sleep(0.05)
restart_ok = False
if gw2 is not None:
    gw = gw2
    t_serve = time.monotonic()
    while time.monotonic() - t_serve < recover_s:
        try:
            if one(f"restarted-{time.monotonic()}")[0] == 200:
                restart_ok = True
                break
        except OSError:
            pass
        time.sleep(0.1)
print(f"  restart        refilled (503 at request {fig['refull_503']}), stopped, started again: "
      + ("serving" if restart_ok else "FAILED: " + open(log2, errors="replace").read()[-400:]))
if not restart_ok:
    print("wal-full-drill: FAILED")
    sys.exit(1)
proc.terminate()
proc.wait(timeout=15)
print("wal-full-drill: ok")
PY
RC=$?
set -e
# The restart phase stops the first crossbar itself; before it, one that is gone died.
if [[ ! -s "$WORK/restarted.pid" ]] && ! kill -0 "$CROSSBAR_PID" 2>/dev/null; then
  echo "wal-full-drill: crossbar is not running; its log:" >&2
  tail -n 30 "$WORK/crossbar.log" >&2
  RC=1
fi
if [[ "$RC" != 0 ]]; then
  echo "== crossbar's store lines" >&2
  grep -E 'store (failing|recovered)|ERROR|panic' "$WORK/crossbar.log" | tail -n 20 >&2 || true
  ls -l "$FS" >&2 || true
fi
exit "$RC"
