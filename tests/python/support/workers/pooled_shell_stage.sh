#!/bin/bash
# A bash + psql stage for the pooler test: the documented worker SQL, one psql per
# message, through a pooler in transaction mode. Each id: read its retries and payload
# (pepsi.get_messages), then one transaction that records the run in public.pool_ran and
# finishes the row. A message whose payload has "flaky": "<this stage>" is answered
# "1 ..." while its retries are 0 (an automatic retry then succeeds).
set -u
stage="${PEPSI_STAGE:?PEPSI_STAGE not set}"
did="${PEPSI_DISPATCHER_ID:?PEPSI_DISPATCHER_ID not set}"
case "$stage" in *[!A-Za-z0-9_]*) echo "bad stage name" >&2; exit 2 ;; esac

q() { psql "$PEPSI_DSN" -X -v ON_ERROR_STOP=1 -Atq "$@" 2>&1; }

while IFS=$'\t' read -r id _; do
    case "$id" in ''|*[!0-9]*) echo "2 bad id line: $id"; continue ;; esac
    if ! got=$(q -c "SELECT retries, coalesce(payload->>'flaky', '')
                     FROM pepsi.get_messages(ARRAY[$id]::bigint[])"); then
        echo "1 psql failed: ${got//$'\n'/ }"; continue
    fi
    retries="${got%%|*}" flaky="${got#*|}"
    if [ "$flaky" = "$stage" ] && [ "$retries" = 0 ]; then
        echo "1 flaky: fails on its first run"; continue
    fi
    if out=$(q -c "BEGIN" \
        -c "INSERT INTO public.pool_ran (id, stage, retries, worker_pid, backend_pid)
            VALUES ($id, '$stage', $retries, $$, pg_backend_pid())" \
        -c "SELECT pepsi.finish($id, '$stage', $did)" -c "COMMIT"); then
        if [ "$out" = "t" ]; then echo "0"; else echo "1 transition did not apply: $out"; fi
    else
        echo "1 psql failed: ${out//$'\n'/ }"
    fi
done
exit 0
