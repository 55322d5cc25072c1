#!/usr/bin/env bash
# Call 2 of session 25: run on the same machine while still held, after gpu34.sh (it needs that call's
# cache folders in /tmp/caches): three more warm launches of each system, interleaved.
test -d /tmp/caches/ind || { echo "gpu35.sh: no /tmp/caches from gpu34.sh on this machine: run gpu34.sh first"; exit 3; }
COLD=0 ROUNDS="3 4 5" TAG=r35 exec bash "$(dirname "$0")/gpu34.sh"
