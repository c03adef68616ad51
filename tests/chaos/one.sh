#!/bin/bash
# Chaos stage b, one message: sleep, then pepsi.advance to c with the fencing token.
# Logs start / tx / end as JSON lines to $CHAOS_LOG/b-PID-STARTTIME.jsonl (its own
# pid and start time: the process that runs the message; a long soak reuses pids).
# Exit 0 only when the transition applied.
id="$1"
stage="${PEPSI_STAGE:?}"
did="${PEPSI_DISPATCHER_ID:-null}"
# The 22nd field of /proc/PID/stat (the 20th after the command name's ")").
start=$(s=$(</proc/$$/stat); s=${s##*) }; set -- $s; echo "${20}")
proc="$stage-$$-$start"
log="$CHAOS_LOG/$proc.jsonl"
emit() { printf '{"ev":"%s","id":%s,"stage":"%s","pid":%s,"proc":"%s","did":%s,"t":%s%s}\n' \
    "$1" "$id" "$stage" "$$" "$proc" "$did" "${EPOCHREALTIME/,/.}" "$2" >>"$log"; }
emit start ""
# Mostly short; CHAOS_B_SLOW_PCT % (default 5) take 2-4 s, long enough to outlive a
# dispatcher restart.
if [ $((RANDOM % 100)) -lt "${CHAOS_B_SLOW_PCT:-5}" ]; then
    sleep "$((RANDOM % 3 + 2))"
else
    sleep "0.$((RANDOM % 5 + 1))"
fi
# psql exits 2 when it cannot connect or loses the connection: retry a few times (a
# PostgreSQL restart or failover), as a stage program should; a lost commit shows as "f".
for try in 1 2 3 4 5 6 7 8 9 10; do
    out=$(PGAPPNAME="chaos-worker $stage" PGCONNECT_TIMEOUT=5 psql "$PEPSI_DSN" -XAtq \
        -c "select pepsi.advance($id, '$stage', 'c', $did)" 2>/dev/null)
    rc=$?
    [ "$rc" = 2 ] || break
    emit tx ',"fn":"advance","ret":null'
    sleep 1
done
case "$rc:$out" in
    0:t) emit tx ',"fn":"advance","ret":true' ;;
    0:f) emit tx ',"fn":"advance","ret":false' ;;
    *) emit tx ',"fn":"advance","ret":null' ;;
esac
emit end ""
[ "$rc:$out" = "0:t" ]
