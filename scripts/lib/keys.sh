# shellcheck shell=bash
# The API keys scripts/up gives a new install, kept in its state directory
# (mode 0600 each; a rerun keeps what is there):
#
#   <state>/api-key    the key programs submit with (named `local`)
#   <state>/admin-key  the operator's key (named `operator`, scope `admin`):
#                      the dashboard, /v1/capacity, /v1/usage of every key
#
#   ensure_api_keys <state>    creates whichever key file is missing; says so
#   api_keys_setting <state>   prints the CODE_RUNNER_API_KEYS value of both

# A new key: 32 random bytes as 64 hex characters.
new_api_key() {
	od -An -N32 -tx1 /dev/urandom | tr -d ' \n'
}

# ensure_key_file <file> <what it is>
ensure_key_file() {
	local file=$1 what=$2
	if [[ -s "$file" ]]; then
		echo "up: keeping the $what in $file"
	else
		(
			umask 077
			new_api_key >"$file.tmp"
		)
		mv "$file.tmp" "$file"
		echo "up: generated a new $what in $file"
	fi
	chmod 0600 "$file"
}

ensure_api_keys() {
	local state=$1
	mkdir -p "$state"
	chmod 0700 "$state"
	ensure_key_file "$state/api-key" "API key for programs"
	ensure_key_file "$state/admin-key" "admin key for the operator"
}

api_keys_setting() {
	local state=$1
	printf 'local:%s,operator:%s:admin' "$(cat "$state/api-key")" "$(cat "$state/admin-key")"
}
