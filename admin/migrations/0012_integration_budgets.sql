-- What a workspace has spent of each budget an organisation integration sets on it (its row in
-- integration_workspaces, else the integration's global_limits under global workspace access),
-- by the budget's index in that list, as workspace_budget_usage counts a workspace's own.
CREATE TABLE integration_budget_usage (
    integration_id TEXT NOT NULL REFERENCES integrations (id) ON DELETE CASCADE,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    budget_index BIGINT NOT NULL CHECK (budget_index >= 0),
    current_usage DOUBLE PRECISION NOT NULL DEFAULT 0,
    usage_period BIGINT NOT NULL DEFAULT 0,
    reset_epoch BIGINT NOT NULL DEFAULT 0,
    status TEXT NOT NULL CHECK (status IN ('active', 'exhausted')),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    PRIMARY KEY (integration_id, workspace_id, budget_index)
);
