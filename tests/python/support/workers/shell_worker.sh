#!/bin/bash
# A stage program in bash + psql: the worker protocol spoken from outside any Python SDK.
#
# Started as: bash shell_worker.sh [STAGE=SUCCESSOR ...] [-c CONFIG_FILE] worker
# with PEPSI_STAGE, PEPSI_DSN and PEPSI_DISPATCHER_ID in the environment.
# For each id read from stdin: advance it to SUCCESSOR when its stage is mapped by an
# argument STAGE=SUCCESSOR, otherwise finish it; answer "0" once psql has committed,
# or "1 <what went wrong>" when the transition did not apply.
set -u

declare -A next=()
for arg in "$@"; do
    case "$arg" in
        *=*) next["${arg%%=*}"]="${arg#*=}" ;;
    esac
done

stage="${PEPSI_STAGE:?PEPSI_STAGE not set}"
did="${PEPSI_DISPATCHER_ID:-NULL}"
case "$stage" in *[!A-Za-z0-9_.-]*) echo "bad stage name" >&2; exit 2 ;; esac

while IFS= read -r id; do
    case "$id" in ''|*[!0-9]*) echo "2 bad id line: $id"; continue ;; esac
    if [ -n "${next[$stage]+x}" ]; then
        sql="select pepsi.advance($id, '$stage', '${next[$stage]}', $did)"
    else
        sql="select pepsi.finish($id, '$stage', $did)"
    fi
    if out=$(psql "$PEPSI_DSN" -X -v ON_ERROR_STOP=1 -Atqc "$sql" 2>&1); then
        if [ "$out" = "t" ]; then
            echo "0"
        else
            echo "1 transition did not apply: $out"
        fi
    else
        echo "1 psql failed: ${out//$'\n'/ }"
    fi
done
exit 0
