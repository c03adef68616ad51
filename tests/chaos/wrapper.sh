#!/bin/bash
# Chaos stage b: a shell wrapper that forks a child (one.sh) per message, as shell stages do.
# A child that fails is answered "1 ..." so answers stay in step with the ids.
dir="$(dirname "$0")"
while IFS= read -r id; do
    if "$dir/one.sh" "$id"; then echo 0; else echo "1 child one.sh failed"; fi
done
exit 0
