# Shared by benches/load/run and benches/load/soak (sourced, not run).

# A free loopback port.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# workspace_key PORT ADMIN_KEY: a new workspace service key of the gateway on PORT holding a rate
# limit and a budget far above what a benchmark sends, so the limit and budget plugins count for
# real; prints the raw key.
workspace_key() {
  local p=$1 admin=$2 ws
  ws=$(first_workspace "$p" "$admin")
  curl -s "http://127.0.0.1:$p/v1/api-keys/workspace/service" \
    -H "x-gw-api-key: $admin" -H 'content-type: application/json' \
    -d '{"name": "bench", "workspace_id": "'"$ws"'", "scopes": ["completions.write"],
         "rate_limits": [{"type": "requests", "unit": "rpm", "value": 1000000000}],
         "usage_limits": {"type": "tokens", "credit_limit": 1000000000000}}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["key"])'
}

# The workspace id of the gateway on PORT (its first workspace).
first_workspace() {
  curl -s "http://127.0.0.1:$1/v1/admin/workspaces" -H "x-gw-api-key: $2" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])'
}
