# shellcheck shell=bash
# A private redis-server and `code-runner serve` on free loopback ports of
# their own (never the shared ones), for the measuring scripts (scripts/bench,
# scripts/supervisor-syscalls). The caller defines `fail MESSAGE` and sets:
#
#   binary   the code-runner binary
#   key      the API key the server takes (named `bench`)
#   out      a directory for redis's files and both logs
#
#   start_private_redis REDIS-ARGS…  starts redis (sets redis_port, redis_pid)
#   start_serve ENV…                 (re)starts serve with NAME=VALUE words on
#                                    top of the common settings (later ones win);
#                                    sets serve_pid, url; waits for /readyz
#   wait_warm N [LANGUAGE]           until the pool holds N ready sandboxes
#   settle_load MAX                  until the 1-minute load average is under
#                                    MAX (a filled pool's work has settled),
#                                    60 s at most, then says what it is
#   stop_private                     stops both, by their pids (the EXIT trap)

redis_pid=""
serve_pid=""

# A loopback port nothing listens on (nothing answers a connect to it).
free_port() {
	local port
	for _ in $(seq 100); do
		port=$((20000 + RANDOM % 20000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			echo "$port"
			return
		fi
	done
	fail "no free loopback port found"
}

api_port="$(free_port)"
worker_port="$(free_port)"
url="http://127.0.0.1:$api_port"

start_private_redis() {
	redis_port="$(free_port)"
	mkdir -p "$out/redis"
	redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$out/redis" --save '' "$@" \
		>"$out/redis.log" 2>&1 &
	redis_pid=$!
	local deadline=$((SECONDS + 10))
	until [[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" == PONG ]]; do
		[[ -e "/proc/$redis_pid" ]] || fail "redis-server exited (see $out/redis.log)"
		((SECONDS < deadline)) || fail "redis-server did not answer within 10 s"
		sleep 0.1
	done
}

start_serve() {
	if [[ -n "$serve_pid" ]]; then
		kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null || true
		serve_pid=""
	fi
	env CODE_RUNNER_REDIS_URL="redis://127.0.0.1:$redis_port" \
		CODE_RUNNER_LISTEN="127.0.0.1:$api_port" \
		CODE_RUNNER_WORKER_LISTEN="127.0.0.1:$worker_port" \
		CODE_RUNNER_API_KEYS="bench:$key" \
		CODE_RUNNER_WORKER_MAX_SANDBOXES=8 \
		CODE_RUNNER_LOG=warn \
		"$@" "$binary" serve >>"$out/serve.log" 2>&1 &
	serve_pid=$!
	local deadline=$((SECONDS + 60))
	until [[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz")" == 200 ]]; do
		[[ -e "/proc/$serve_pid" ]] || fail "code-runner serve exited (see $out/serve.log)"
		((SECONDS < deadline)) || fail "code-runner serve was not ready within 60 s"
		sleep 0.2
	done
}

wait_warm() {
	local deadline=$((SECONDS + 120))
	until curl -s "$url/metrics" | grep -qx "code_runner_warm_ready{language=\"${2:-python}\"} $1"; do
		((SECONDS < deadline)) || fail "the warm pool did not reach $1 ready sandboxes within 120 s"
		sleep 0.2
	done
}

settle_load() {
	local deadline=$((SECONDS + 60)) load
	while :; do
		load="$(cut -d' ' -f1 /proc/loadavg)"
		awk -v l="$load" -v m="$1" 'BEGIN { exit !(l < m) }' && break
		((SECONDS < deadline)) || break
		sleep 1
	done
	echo "bench: load average $load before the run"
}

stop_private() {
	[[ -n "$serve_pid" ]] && kill -TERM "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
	[[ -n "$redis_pid" ]] && kill -TERM "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
	return 0
}
