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
for t in test_engine test_store test_dummy example bench_abi; do
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

# A real client serving dummy clients (test_dummy) on a Unix socket, with
# a shared hot cache that admits a key at its first miss, started as
# python/tests/test_dummy.py does.
sockdir=$(mktemp -d)
clog=$(mktemp)
MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD=1 bin/crescent-client --master_server_address "$addr" \
	--global_segment_size 64MiB --local_buffer_size 16MiB --metrics_port 0 --metrics_address 127.0.0.1 \
	--local_hostname 127.0.0.1 --admin_token_file "$admin" --local_socket "$sockdir/crescent.sock" \
	--local_hot_cache_size 16MiB --local_hot_block_size 1MiB --local_hot_cache_shm=1 >"$clog" 2>&1 &
client=$!
trap 'kill $client $master 2>/dev/null; wait $client $master 2>/dev/null; rm -rf "$log" "$admin" "$clog" "$sockdir"' EXIT
for _ in $(seq 300); do
	grep -q 'metrics on' "$clog" && break
	kill -0 $client || { cat "$clog"; exit 1; }
	sleep 0.1
done
grep -q 'metrics on' "$clog" || { echo "crescent-client did not start"; cat "$clog"; exit 1; }
export CRESCENT_LOCAL_SOCKET=$sockdir/crescent.sock

timeout 120 build/test_engine
timeout 120 build/test_store
timeout 120 build/test_dummy
timeout 60 build/example "$addr"
timeout 60 build/bench_abi 100000
if [ "${CRESCENT_SKIP_PYTHON:-}" = "" ]; then
	CRESCENT_LIB=$PWD/build/libcrescent.so timeout 300 python3 -m unittest discover -s python/tests -t python/tests -v
fi
