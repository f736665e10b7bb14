#!/usr/bin/env bash
# One command for every number in bench/RESULTS.md: the peers (the raw PostgreSQL limit,
# procrastinate, django-tasks-db, pgqueuer) from /work/shared/bench-peers, then vpay, then
# vpay's and pgqueuer's enqueue in alternating turns, in the same session, on the same
# PostgreSQL (127.0.0.1:5432, role root, trust auth), with the same method. Sequential on
# purpose (a 2-core box): nothing else heavy should run meanwhile; the load average is recorded.
#
#   make bench                      (= bench/run.sh, REPS=1: about 18 minutes, plus a few
#                                    minutes the first time to build the peers' venv)
#   REPS=2 bench/run.sh             (two repetitions of everything, about 32 minutes)
#
# Environment: REPS (default 1); PEERS (default "raw procrastinate django_tasks pgqueuer", the
# parts of the peers' harness to run); RAW_SECONDS (default 10, per pgbench scenario);
# SIDE_BLOCKS (default 8: turns of bench/enqueue_side_by_side.py, after vpay's phase);
# PEERS_SRC (default ../shared/bench-peers, may be
# read-only); PEERS_DIR (the writable copy, default ${TMPDIR:-/tmp}/vpay-bench-peers; its
# .venv is kept between runs while requirements.lock.txt is unchanged); PY (vpay's
# python, default .venv/bin/python); VPAY_ARGS (extra arguments for bench_vpay.py);
# VPAY_REF (measure that commit instead of the working tree, see below).
# Databases used: bench_raw, bench_pgqueuer, bench_procrastinate, bench_djtasks (the peers'
# harness) and bench_vpay.
# The peers' libraries live only in the copy's .venv, never in vpay's requirements.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-1}
PEERS_SRC=${PEERS_SRC:-$ROOT/../shared/bench-peers}
PEERS_DIR=${PEERS_DIR:-${TMPDIR:-/tmp}/vpay-bench-peers}
PY=${PY:-$ROOT/.venv/bin/python}
OUT=$ROOT/bench/out
MARK=.vpay-bench-peers-copy

[ -x "$PY" ] || { echo "no $PY: run 'make bench' (it installs the project venv) or set PY"; exit 1; }
[ -f "$PEERS_SRC/run_all.sh" ] || { echo "peers harness not found at $PEERS_SRC (set PEERS_SRC)"; exit 1; }

# --- wait (bounded) for a quiet machine: CPU busy < 15% over 2 s, three times in a row -----
busy_pct() {  # system-wide CPU busy % over 2 s, from /proc/stat
  local a b
  read -r _ u1 n1 s1 i1 w1 q1 sq1 st1 _ < /proc/stat; sleep 2
  read -r _ u2 n2 s2 i2 w2 q2 sq2 st2 _ < /proc/stat
  a=$(( (u2+n2+s2+q2+sq2+st2) - (u1+n1+s1+q1+sq1+st1) )); b=$(( a + (i2+w2) - (i1+w1) ))
  echo $(( b > 0 ? 100 * a / b : 0 ))
}
QUIET_WAIT=${QUIET_WAIT:-300}
quiet=0; waited=0
while [ "$quiet" -lt 3 ] && [ "$waited" -lt "$QUIET_WAIT" ]; do
  if [ "$(busy_pct)" -lt 15 ]; then quiet=$((quiet + 1)); else quiet=0; fi
  waited=$((waited + 2))
done
QUIET_NOTE="machine quiet (CPU busy < 15% for 6 s) after ${waited} s"
[ "$quiet" -ge 3 ] || QUIET_NOTE="machine NOT quiet after waiting ${QUIET_WAIT} s: numbers may be disturbed"
echo "=== $QUIET_NOTE"

STARTED=$(date -u +%FT%TZ)
STAMP=$(date -u +%Y%m%dT%H%M%SZ)

# --- fresh output folder (previous results kept aside) -------------------------------------
mkdir -p "$OUT"
if ls "$OUT"/*.jsonl >/dev/null 2>&1; then
  mkdir -p "$OUT/prev_$STAMP"
  find "$OUT" -maxdepth 1 -mindepth 1 ! -name 'prev_*' -exec mv {} "$OUT/prev_$STAMP/" \;
fi

# --- writable copy of the peers' harness (sources fresh, venv reused) -----------------------
if [ -e "$PEERS_DIR" ] && [ ! -e "$PEERS_DIR/$MARK" ] && [ -n "$(ls -A "$PEERS_DIR")" ]; then
  echo "$PEERS_DIR exists and is not a copy made by this script; set PEERS_DIR"; exit 1
fi
mkdir -p "$PEERS_DIR"
find "$PEERS_DIR" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +
(cd "$PEERS_SRC" && tar --exclude=./.venv --exclude=./out -cf - .) | (cd "$PEERS_DIR" && tar -xf -)
chmod -R u+w "$PEERS_DIR"
touch "$PEERS_DIR/$MARK"
if [ -d "$PEERS_DIR/.venv" ] && ! cmp -s "$PEERS_DIR/requirements.lock.txt" "$PEERS_DIR/.venv/.lock"; then
  rm -rf "$PEERS_DIR/.venv"   # built from another lock file: rebuild
fi

# --- machine facts (run_all.sh only records them on a full, un-ONLY'd run) ------------------
{
  echo "run started: $STARTED  (REPS=$REPS); $QUIET_NOTE"
  (cd "$PEERS_DIR" && ./machine_facts.sh)
  echo "## busiest processes at start"
  ps -eo pcpu,pmem,etime,comm --sort=-pcpu | head -8
} > "$OUT/machine_facts.txt" 2>&1

# --- peers ---------------------------------------------------------------------------------
# pgqueuer last: its figures are the targets' yardstick, so it runs next to vpay's.
PEERS=${PEERS:-raw procrastinate django_tasks pgqueuer}
echo "=== peers: $PEERS (REPS=$REPS, RAW_SECONDS=${RAW_SECONDS:-10}) $(date -u +%T)"
(cd "$PEERS_DIR" && rm -rf out && ONLY="$PEERS" REPS=$REPS RAW_SECONDS=${RAW_SECONDS:-10} ./run_all.sh)
cp "$PEERS_DIR/requirements.lock.txt" "$PEERS_DIR/.venv/.lock"
echo "loadavg after peers: $(cat /proc/loadavg)" >> "$OUT/machine_facts.txt"
mkdir -p "$OUT/peers"
cp "$PEERS_DIR"/out/*.jsonl "$OUT/peers/"
cp "$PEERS_DIR"/out/tables.md "$OUT/peers/" 2>/dev/null || true
[ -d "$PEERS_DIR/out/raw_limit" ] && cp -r "$PEERS_DIR/out/raw_limit" "$OUT/peers/"
cp "$PEERS_DIR"/out/*.log "$OUT/peers/" 2>/dev/null || true

# --- vpay ----------------------------------------------------------------------------------
# VPAY_REF unset: the working tree as it is. VPAY_REF=<commit> (e.g. HEAD): that commit's
# files exported to a temp folder (git archive) with this bench/ copied in, so edits in
# progress in the working tree do not leak into the measurement.
HEAD_SHORT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "${VPAY_REF:-}" ]; then
  SRC=${TMPDIR:-/tmp}/vpay-bench-src
  rm -rf "$SRC" && mkdir -p "$SRC"
  git -C "$ROOT" archive "$VPAY_REF" | tar -x -C "$SRC"
  rm -rf "$SRC/bench" && mkdir -p "$SRC/bench"
  (cd "$ROOT/bench" && tar --exclude=./out --exclude=./__pycache__ -cf - .) | (cd "$SRC/bench" && tar -xf -)
  SOURCE="commit $(git -C "$ROOT" rev-parse --short "$VPAY_REF") (VPAY_REF=$VPAY_REF, exported to $SRC)"
else
  SRC=$ROOT
  DIRTY=$(git -C "$ROOT" status --porcelain -- . ':!bench' 2>/dev/null | wc -l)
  SOURCE="working tree at $HEAD_SHORT ($DIRTY files changed outside bench/)"
fi
echo "=== vpay (REPS=$REPS; $SOURCE) $(date -u +%T)"
# shellcheck disable=SC2086
VPAY_BENCH_OUT=$OUT VPAY_BENCH_SOURCE=$SOURCE timeout 3600 "$PY" "$SRC/bench/bench_vpay.py" --reps "$REPS" ${VPAY_ARGS:-}
# The enqueue targets' ratios again, vpay and pgqueuer in alternating turns (drift taken out).
echo "=== enqueue side by side with pgqueuer $(date -u +%T)"
VPAY_BENCH_OUT=$OUT PEERS_DIR=$PEERS_DIR timeout 1800 "$PY" "$SRC/bench/enqueue_side_by_side.py" --blocks "${SIDE_BLOCKS:-8}"
echo "loadavg at end: $(cat /proc/loadavg)" >> "$OUT/machine_facts.txt"
{ echo "## busiest processes at end"; ps -eo pcpu,pmem,etime,comm --sort=-pcpu | head -8; } >> "$OUT/machine_facts.txt"

FINISHED=$(date -u +%FT%TZ)
"$PY" bench/report.py --peers-out "$OUT/peers" --facts "$OUT/machine_facts.txt" \
  --out "$ROOT/bench/RESULTS.md" --started "$STARTED" --finished "$FINISHED" \
  --rerun "REPS=$REPS${VPAY_REF:+ VPAY_REF=$VPAY_REF} bench/run.sh   # from the repository root"
echo "=== done $(date -u +%T): bench/RESULTS.md"
