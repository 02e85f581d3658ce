-- What enforcement on the request path needs from the control plane: counted usage with its
-- reset period and reset epoch wherever usage is stored, the usage of workspace budgets, request
-- logs and their exports. Portable SQL, as in 0001: ids UUID text, times RFC 3339 text, JSON as
-- text, booleans 0/1 integers.
--
-- usage_period: the reset period (plugin_sdk UsageLimit::period_at) current_usage was counted
-- in; usage of an earlier period than the current one counts as zero.
-- reset_epoch: bumped by each manual reset; a charge counted before it is dropped.

ALTER TABLE api_keys ADD COLUMN usage_period BIGINT NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN reset_epoch BIGINT NOT NULL DEFAULT 0;

ALTER TABLE providers ADD COLUMN usage_period BIGINT NOT NULL DEFAULT 0;
ALTER TABLE providers ADD COLUMN reset_epoch BIGINT NOT NULL DEFAULT 0;

ALTER TABLE usage_limits_policy_entities ADD COLUMN usage_period BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_limits_policy_entities ADD COLUMN reset_epoch BIGINT NOT NULL DEFAULT 0;

-- The usage of one item of a workspace's usage_limits list (budget_index: its position). A row
-- is made by the item's first charge; rows past the end of the list are removed when the list
-- shrinks.
CREATE TABLE workspace_budget_usage (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    budget_index BIGINT NOT NULL CHECK (budget_index >= 0),
    current_usage DOUBLE PRECISION NOT NULL DEFAULT 0,
    usage_period BIGINT NOT NULL DEFAULT 0,
    reset_epoch BIGINT NOT NULL DEFAULT 0,
    status TEXT NOT NULL CHECK (status IN ('active', 'exhausted')),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    PRIMARY KEY (workspace_id, budget_index)
);

-- One request through the gateway (source 'gateway'), or a log sent with POST /v1/logs
-- (source 'external'). organisation_id is the bootstrap organisation for anonymous requests.
-- No foreign keys: a log outlives the key, workspace or provider it names.
CREATE TABLE request_logs (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL,
    workspace_id TEXT,
    api_key_id TEXT,
    user_id TEXT,
    trace_id TEXT NOT NULL,
    span_id TEXT,
    parent_span_id TEXT,
    span_name TEXT,
    created_at TEXT NOT NULL,
    metadata TEXT NOT NULL,
    route TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    provider TEXT,
    model TEXT,
    status_code BIGINT NOT NULL,
    latency_ms BIGINT NOT NULL,
    upstream_latency_ms BIGINT,
    prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    cost DOUBLE PRECISION,
    cache_status TEXT,
    retries BIGINT NOT NULL,
    final_target TEXT,
    streamed BIGINT NOT NULL CHECK (streamed IN (0, 1)),
    error TEXT,
    request_body TEXT,
    response_body TEXT,
    source TEXT NOT NULL CHECK (source IN ('gateway', 'external'))
);
CREATE INDEX request_logs_time ON request_logs (organisation_id, created_at);
CREATE INDEX request_logs_trace ON request_logs (trace_id);

-- An export of request logs: its filters and fields, and once started the matching records as
-- JSON lines (kept here, so any instance serves the download).
CREATE TABLE log_exports (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    workspace_id TEXT,
    description TEXT,
    filters TEXT NOT NULL,
    requested_data TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('draft', 'in_progress', 'success', 'failed', 'cancelled')),
    total BIGINT NOT NULL,
    data TEXT,
    created_by TEXT,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL
);
CREATE INDEX log_exports_list ON log_exports (organisation_id, created_at);
