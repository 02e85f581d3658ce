-- The control plane's first tables. Portable SQL: the same file runs on SQLite and PostgreSQL.
-- Ids are UUIDs as text and times are RFC 3339 UTC text of fixed width
-- (2026-01-02T03:04:05.678901Z), so they sort and compare as text on both databases.
-- JSON documents (settings, limits, scopes) are text as well.

CREATE TABLE organisations (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    settings TEXT NOT NULL,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL
);

-- One row at most: the organisation made by the first start.
CREATE TABLE bootstrap (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    created_at TEXT NOT NULL
);

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    email TEXT NOT NULL,
    first_name TEXT,
    last_name TEXT,
    role TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member')),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    UNIQUE (organisation_id, email)
);

CREATE TABLE workspaces (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    slug TEXT NOT NULL,
    name TEXT NOT NULL,
    description TEXT,
    defaults TEXT NOT NULL,
    usage_limits TEXT NOT NULL,
    rate_limits TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('active', 'archived')),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    UNIQUE (organisation_id, slug)
);

CREATE TABLE workspace_members (
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('admin', 'manager', 'member')),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    PRIMARY KEY (workspace_id, user_id)
);

-- A key's workspace cannot be deleted while the key exists: deleting a workspace removes its
-- keys first (force_delete) or is refused.
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    workspace_id TEXT REFERENCES workspaces (id),
    user_id TEXT REFERENCES users (id),
    created_by_user_id TEXT REFERENCES users (id) ON DELETE SET NULL,
    type TEXT NOT NULL CHECK (type IN ('organisation-service', 'workspace-service', 'workspace-user')),
    name TEXT NOT NULL,
    description TEXT,
    -- SHA-256 of the raw key, hex; the raw key itself is never stored.
    key_hash TEXT NOT NULL UNIQUE,
    key_mask TEXT NOT NULL,
    -- After a rotation the previous key keeps working until previous_key_expires_at.
    previous_key_hash TEXT,
    previous_key_expires_at TEXT,
    status TEXT NOT NULL CHECK (status IN ('active', 'exhausted', 'expired')),
    scopes TEXT NOT NULL,
    rate_limits TEXT NOT NULL,
    usage_limits TEXT,
    current_usage DOUBLE PRECISION NOT NULL DEFAULT 0,
    defaults TEXT NOT NULL,
    alert_emails TEXT NOT NULL,
    rotation_policy TEXT,
    expires_at TEXT,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL
);
CREATE INDEX api_keys_previous_key_hash ON api_keys (previous_key_hash);
CREATE INDEX api_keys_workspace ON api_keys (organisation_id, workspace_id);
CREATE INDEX api_keys_expiry ON api_keys (status, expires_at);

CREATE TABLE audit_logs (
    id TEXT PRIMARY KEY,
    timestamp TEXT NOT NULL,
    organisation_id TEXT NOT NULL,
    workspace_id TEXT,
    user_id TEXT,
    user_type TEXT NOT NULL,
    api_key_id TEXT,
    action TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id TEXT,
    method TEXT NOT NULL,
    uri TEXT NOT NULL,
    request_id TEXT NOT NULL,
    request_body TEXT,
    response_status_code BIGINT NOT NULL,
    client_ip TEXT
);
CREATE INDEX audit_logs_time ON audit_logs (organisation_id, timestamp);
