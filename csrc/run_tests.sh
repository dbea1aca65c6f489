#!/bin/bash
# Builds and runs the C tests, the C example and the Python tests against
# a crescent-master started here on a free loopback port (make test).
# Needs build/libcrescent.so (make lib) and bin/crescent-master,
# bin/crescent-client (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
CC=${CC:-gcc}
CFLAGS="-O2 -Wall -Wextra -Werror -Iinclude"
LDFLAGS="-Lbuild -lcrescent -Wl,-rpath,\$ORIGIN -lpthread"
for t in test_engine test_store example bench_abi; do
	$CC $CFLAGS -o build/$t csrc/$t.c $LDFLAGS
done

log=$(mktemp)
# The admin token: the C tests' remove_all, remove_by_regex and forced
# removes present it (CRESCENT_ADMIN_TOKEN_FILE), as a deployment would.
admin=$(mktemp) # mode 0600, as --admin_token_file requires
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$admin"
bin/crescent-master --rpc_address 127.0.0.1 --rpc_port 0 --metrics_port 0 --admin_token_file "$admin" 2>"$log" &
master=$!
trap 'kill $master 2>/dev/null; wait $master 2>/dev/null; rm -f "$log" "$admin"' EXIT
export CRESCENT_ADMIN_TOKEN_FILE=$admin
addr=""
for _ in $(seq 100); do
	addr=$(grep -o 'rpc=[0-9.]*:[0-9]*' "$log" | head -1 | cut -d= -f2) && [ -n "$addr" ] && break
	kill -0 $master || { cat "$log"; exit 1; }
	sleep 0.1
done
[ -n "$addr" ] || { echo "master did not start"; cat "$log"; exit 1; }
export CRESCENT_MASTER=$addr

timeout 120 build/test_engine
timeout 120 build/test_store
timeout 60 build/example "$addr"
timeout 60 build/bench_abi 100000
if [ "${CRESCENT_SKIP_PYTHON:-}" = "" ]; then
	CRESCENT_LIB=$PWD/build/libcrescent.so timeout 300 python3 -m unittest discover -s python/tests -t python/tests -v
fi
