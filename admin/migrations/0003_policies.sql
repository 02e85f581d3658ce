-- Rate limits policies and usage limits policies, and the usage each usage limits policy has
-- counted per entity (one row per value key, e.g. `metadata._user:alice`). Portable SQL, as in
-- 0001: ids are UUID text, times RFC 3339 text, conditions and group_by JSON text.
-- A policy belongs to one workspace and goes with it when the workspace is deleted.

CREATE TABLE rate_limits_policies (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name TEXT,
    conditions TEXT NOT NULL,
    group_by TEXT NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('requests', 'tokens')),
    unit TEXT NOT NULL CHECK (unit IN ('rpm', 'rph', 'rpd')),
    value BIGINT NOT NULL CHECK (value >= 0),
    status TEXT NOT NULL CHECK (status IN ('active', 'archived')),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL
);
CREATE INDEX rate_limits_policies_list ON rate_limits_policies (organisation_id, status, workspace_id);

CREATE TABLE usage_limits_policies (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    name TEXT,
    conditions TEXT NOT NULL,
    group_by TEXT NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('cost', 'tokens')),
    credit_limit DOUBLE PRECISION NOT NULL CHECK (credit_limit >= 0),
    alert_threshold DOUBLE PRECISION,
    periodic_reset TEXT CHECK (periodic_reset IN ('weekly', 'monthly')),
    periodic_reset_days BIGINT CHECK (periodic_reset_days BETWEEN 1 AND 365),
    next_usage_reset_at TEXT,
    status TEXT NOT NULL CHECK (status IN ('active', 'archived')),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    CHECK (periodic_reset IS NULL OR periodic_reset_days IS NULL)
);
CREATE INDEX usage_limits_policies_list ON usage_limits_policies (organisation_id, status, workspace_id);

-- What a usage limits policy has counted for one entity (one distinct combination of its
-- group_by values). `exhausted` once current_usage reaches the policy's credit_limit; active
-- again after a reset or when the credit limit is raised above current_usage.
CREATE TABLE usage_limits_policy_entities (
    id TEXT PRIMARY KEY,
    policy_id TEXT NOT NULL REFERENCES usage_limits_policies (id) ON DELETE CASCADE,
    value_key TEXT NOT NULL,
    current_usage DOUBLE PRECISION NOT NULL DEFAULT 0,
    status TEXT NOT NULL CHECK (status IN ('active', 'exhausted')),
    last_reset_at TEXT,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    UNIQUE (policy_id, value_key)
);
