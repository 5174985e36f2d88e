# shellcheck shell=bash
# Shared helpers of scripts/up, scripts/test and .ci/run: make sure the packages,
# dockerd (with gVisor's runsc registered) and a local redis-server are there.
# Source it; every function is idempotent and says what it changes.
#
#   ensure_packages   apt-get install what is missing of the daemon's packages (or of those named)
#   ensure_test_packages  the same for the test suite's own packages (loudly)
#   ensure_dockerd    /etc/docker/daemon.json registers runsc; dockerd running and answering
#   ensure_redis      redis-server answering on 127.0.0.1:6379, durable (AOF) when it starts it
#   ensure_redis_durable  the running redis-server made durable (AOF, noeviction) at run time
#
# Network rule: dockerd runs with --bridge=none so no container ever gets a network.

# What scripts/up installs (and .ci/run, which installs nothing more, so CI
# proves that scripts/test brings the rest itself).
CODE_RUNNER_PACKAGES=(docker.io redis-server runsc mmdebstrap python3 curl)
# Only the tests need these: real clients not written by this project
# (promtool checks /metrics, Python websockets and curl drive the streams,
# headless Chromium driven by Selenium opens the playground and dashboard,
# python3-venv holds the judge0 SDK, see scripts/compat-clients), zstd to
# build the Fly worker image (deploy-fly/build-image), systemd for
# `systemd-analyze verify` of the unit scripts/install writes, iproute2 for
# `ss -K` (tests/api/http_limits.rs destroys a listening socket).
# scripts/test installs whichever is missing.
CODE_RUNNER_TEST_PACKAGES=(prometheus python3-websockets curl zstd systemd chromium chromium-driver python3-selenium python3-venv iproute2)
# Python tools run under the interpreter Debian's python3-* packages are
# installed for, whatever python3 comes first on PATH (pyenv, a venv).
CODE_RUNNER_PYTHON="${CODE_RUNNER_PYTHON:-/usr/bin/python3}"
CODE_RUNNER_DAEMON_JSON="${CODE_RUNNER_DAEMON_JSON:-/etc/docker/daemon.json}"
CODE_RUNNER_DOCKERD_LOG="${CODE_RUNNER_DOCKERD_LOG:-/var/log/code-runner-dockerd.log}"
CODE_RUNNER_REDIS_PORT="${CODE_RUNNER_REDIS_PORT:-6379}"
# Where a redis-server these scripts start keeps its append-only file.
CODE_RUNNER_REDIS_DIR="${CODE_RUNNER_REDIS_DIR:-/var/lib/code-runner/redis}"
# How every Redis of code-runner runs (docs/operations.md says what each
# setting loses): every write in the append-only file, fsynced once a second
# (a crash loses at most about a second of changes); a full Redis refuses
# writes (submissions get 503) instead of evicting jobs, results or heartbeats.
# tests/worker/durability.rs starts its redis-server with exactly these arguments.
CODE_RUNNER_REDIS_DURABLE_ARGS=(--appendonly yes --appendfsync everysec --maxmemory-policy noeviction)

_svc_say() { echo "services: $*"; }
_svc_die() {
	echo "services: ERROR: $*" >&2
	return 1
}

_svc_pkg_installed() {
	[[ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" == installed ]]
}

# Installs whichever of the packages is missing (apt-get update once first);
# with arguments, those packages instead of the daemon's.
ensure_packages() {
	local missing=() p wanted=("${CODE_RUNNER_PACKAGES[@]}")
	[[ $# -eq 0 ]] || wanted=("$@")
	for p in "${wanted[@]}"; do
		_svc_pkg_installed "$p" || missing+=("$p")
	done
	if [[ ${#missing[@]} -eq 0 ]]; then
		_svc_say "packages: all present (${wanted[*]})"
		return 0
	fi
	[[ $EUID -eq 0 ]] || _svc_die "packages missing (${missing[*]}) and not root: run as root" || return 1
	_svc_say ">>> INSTALLING PACKAGES: ${missing[*]} (apt-get update, apt-get install -y)"
	DEBIAN_FRONTEND=noninteractive apt-get update -q ||
		_svc_die "apt-get update failed" || return 1
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" ||
		_svc_die "apt-get install ${missing[*]} failed" || return 1
	for p in "${missing[@]}"; do
		_svc_pkg_installed "$p" || _svc_die "package $p is still not installed after apt-get install" || return 1
	done
	_svc_say "packages: installed ${missing[*]}"
}

# The test suite's packages, installed loudly when missing (scripts/test
# calls it, so scripts/up then scripts/test works on a fresh machine).
ensure_test_packages() {
	ensure_packages "${CODE_RUNNER_TEST_PACKAGES[@]}"
}

# Makes daemon.json register runsc with --network=none, and runsc-egress (the
# same with --host-uds=open: only sandboxes of jobs with network run under it,
# to reach their egress socket; docs/egress.md), keeping every other setting.
# Prints what changed; returns 0 when unchanged, 10 when it wrote a change.
_svc_daemon_json() {
	local runsc
	runsc="$(command -v runsc || true)"
	[[ -n "$runsc" ]] || runsc=/usr/bin/runsc
	mkdir -p "$(dirname "$CODE_RUNNER_DAEMON_JSON")"
	"$CODE_RUNNER_PYTHON" - "$CODE_RUNNER_DAEMON_JSON" "$runsc" <<'PY'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
want = {
    "runsc": {"path": runsc, "runtimeArgs": ["--network=none"]},
    "runsc-egress": {"path": runsc, "runtimeArgs": ["--network=none", "--host-uds=open"]},
}
conf = {}
if os.path.exists(path):
    raw = open(path).read()
    if raw.strip():
        try:
            conf = json.loads(raw)
        except ValueError as e:
            sys.exit(f"services: ERROR: {path} is not valid JSON ({e}); fix or remove it")
    if not isinstance(conf, dict):
        sys.exit(f"services: ERROR: {path} is not a JSON object; fix or remove it")
runtimes = conf.get("runtimes")
if runtimes is not None and not isinstance(runtimes, dict):
    sys.exit(f"services: ERROR: {path}: \"runtimes\" is not an object; fix it")
have = {name: (runtimes or {}).get(name) for name in want}
if have == want:
    sys.exit(0)
conf.setdefault("runtimes", {}).update(want)
tmp = path + ".code-runner.tmp"
with open(tmp, "w") as f:
    json.dump(conf, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
for name in want:
    if have[name] != want[name]:
        print(f"services: {path}: runtimes.{name} was {json.dumps(have[name])}, now {json.dumps(want[name])}")
sys.exit(10)
PY
}

_svc_docker_up() { docker info >/dev/null 2>&1; }
_svc_runtimes() {
	docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null | sed 's/ $//'
}
# Both gVisor runtimes are listed (by their exact names).
_svc_docker_has_runsc() {
	local listed
	listed=" $(_svc_runtimes) "
	[[ "$listed" == *" runsc "* && "$listed" == *" runsc-egress "* ]]
}

# Waits up to $1 seconds for `docker info` to answer.
_svc_wait_docker() {
	local deadline=$((SECONDS + $1))
	until _svc_docker_up; do
		((SECONDS < deadline)) || return 1
		sleep 0.5
	done
}

ensure_dockerd() {
	command -v dockerd >/dev/null || _svc_die "dockerd is not installed: run scripts/up or .ci/run (they install docker.io)" || return 1
	command -v runsc >/dev/null || _svc_die "runsc is not installed: run scripts/up or .ci/run (they install runsc)" || return 1
	local rc=0
	_svc_daemon_json || rc=$?
	case $rc in
	0 | 10) ;;
	*) _svc_die "could not update $CODE_RUNNER_DAEMON_JSON" || return 1 ;;
	esac

	if _svc_docker_up; then
		if [[ $rc -eq 10 ]] || ! _svc_docker_has_runsc; then
			# Runtimes are part of dockerd's live-reloadable configuration.
			local pid
			pid="$(cat /var/run/docker.pid 2>/dev/null || true)"
			[[ -n "$pid" ]] || _svc_die "dockerd answers but its pid is unknown; restart it to load $CODE_RUNNER_DAEMON_JSON" || return 1
			_svc_say "dockerd: reloading its configuration (SIGHUP to pid $pid) for the runsc runtimes"
			kill -HUP "$pid"
			local deadline=$((SECONDS + 10))
			until _svc_docker_has_runsc || ((SECONDS >= deadline)); do
				sleep 0.5
			done
		fi
		_svc_docker_has_runsc || _svc_die "dockerd is running but does not list the runsc and runsc-egress runtimes (see $CODE_RUNNER_DAEMON_JSON)" || return 1
		_svc_say "dockerd: running ($(docker info --format '{{.ServerVersion}}' 2>/dev/null), runtimes: $(_svc_runtimes))"
		return 0
	fi

	local pidfile=/var/run/docker.pid running_pid=""
	running_pid="$(cat "$pidfile" 2>/dev/null || true)"
	if [[ -n "$running_pid" ]] && kill -0 "$running_pid" 2>/dev/null; then
		_svc_say "dockerd: pid $running_pid ($pidfile) does not answer yet; waiting"
	else
		[[ $EUID -eq 0 ]] || _svc_die "dockerd is not running and starting it needs root" || return 1
		_svc_say ">>> STARTING DOCKERD: dockerd --bridge=none --iptables=false --ip-forward=false (log: $CODE_RUNNER_DOCKERD_LOG)"
		setsid dockerd --bridge=none --iptables=false --ip-forward=false \
			</dev/null >>"$CODE_RUNNER_DOCKERD_LOG" 2>&1 &
		disown || true
	fi
	if ! _svc_wait_docker 60; then
		echo "services: last lines of $CODE_RUNNER_DOCKERD_LOG:" >&2
		tail -n 20 "$CODE_RUNNER_DOCKERD_LOG" >&2 || true
		_svc_die "dockerd did not answer 'docker info' within 60 s" || return 1
	fi
	_svc_docker_has_runsc || _svc_die "dockerd started but does not list the runsc and runsc-egress runtimes (see $CODE_RUNNER_DAEMON_JSON)" || return 1
	_svc_say "dockerd: up ($(docker info --format '{{.ServerVersion}}' 2>/dev/null), runtimes: $(_svc_runtimes))"
}

_svc_redis_up() {
	[[ "$(redis-cli -h 127.0.0.1 -p "$CODE_RUNNER_REDIS_PORT" ping 2>/dev/null)" == PONG ]]
}

ensure_redis() {
	command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
		_svc_die "redis-server is not installed: run scripts/up or .ci/run (they install redis-server)" || return 1
	if _svc_redis_up; then
		_svc_say "redis: running on 127.0.0.1:$CODE_RUNNER_REDIS_PORT"
		return 0
	fi
	mkdir -p "$CODE_RUNNER_REDIS_DIR" || _svc_die "cannot create $CODE_RUNNER_REDIS_DIR" || return 1
	_svc_say ">>> STARTING REDIS: redis-server on 127.0.0.1:$CODE_RUNNER_REDIS_PORT (${CODE_RUNNER_REDIS_DURABLE_ARGS[*]}, data in $CODE_RUNNER_REDIS_DIR)"
	redis-server --port "$CODE_RUNNER_REDIS_PORT" --bind 127.0.0.1 --dir "$CODE_RUNNER_REDIS_DIR" \
		"${CODE_RUNNER_REDIS_DURABLE_ARGS[@]}" --daemonize yes >/dev/null ||
		_svc_die "redis-server failed to start" || return 1
	local deadline=$((SECONDS + 10))
	until _svc_redis_up; do
		((SECONDS < deadline)) || _svc_die "redis-server does not answer PING on 127.0.0.1:$CODE_RUNNER_REDIS_PORT within 10 s" || return 1
		sleep 0.2
	done
	_svc_say "redis: up on 127.0.0.1:$CODE_RUNNER_REDIS_PORT"
}

# The redis-server answering on $CODE_RUNNER_REDIS_PORT with AOF and noeviction, set at
# run time when it runs without them (one started before, by an older scripts/up or by
# hand); CONFIG REWRITE keeps them across its restarts when it has a config file.
ensure_redis_durable() {
	local cli=(redis-cli -h 127.0.0.1 -p "$CODE_RUNNER_REDIS_PORT")
	local aof policy
	aof="$("${cli[@]}" CONFIG GET appendonly 2>/dev/null | tail -n 1)"
	policy="$("${cli[@]}" CONFIG GET maxmemory-policy 2>/dev/null | tail -n 1)"
	if [[ "$aof" == yes && "$policy" == noeviction ]]; then
		_svc_say "redis: durable (appendonly yes, maxmemory-policy noeviction)"
		return 0
	fi
	_svc_say ">>> MAKING REDIS DURABLE: it runs with appendonly=$aof maxmemory-policy=$policy; setting ${CODE_RUNNER_REDIS_DURABLE_ARGS[*]}"
	"${cli[@]}" CONFIG SET appendonly yes >/dev/null &&
		"${cli[@]}" CONFIG SET appendfsync everysec >/dev/null &&
		"${cli[@]}" CONFIG SET maxmemory-policy noeviction >/dev/null ||
		_svc_die "could not make redis durable (CONFIG SET refused)" || return 1
	if [[ "$("${cli[@]}" CONFIG REWRITE 2>&1)" != OK ]]; then
		_svc_say "redis: WARNING: it has no config file to keep these settings in; start it with ${CODE_RUNNER_REDIS_DURABLE_ARGS[*]} after a restart"
	fi
}
