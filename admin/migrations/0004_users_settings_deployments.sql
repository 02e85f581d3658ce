-- Users, invites, workspace members, workspace settings and deployments. Portable SQL: the
-- same file runs on SQLite and PostgreSQL (ids UUID text, times RFC 3339 text, JSON as text).
-- Users and workspace members are the tables of 0001; organisation settings are the JSON
-- document on organisations.

-- The scopes an accepted invite gave the member's workspace key in this workspace.
ALTER TABLE workspace_members ADD COLUMN scopes TEXT NOT NULL DEFAULT '[]';

-- An invitation to join the organisation. The link's token is stored only as its SHA-256.
-- `workspaces` is a JSON list of {id, role}; `scopes` (JSON list, or NULL) the scopes of the
-- workspace keys made for the new user on acceptance. A pending invite past its expires_at
-- reads as expired.
CREATE TABLE invites (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    email TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('admin', 'member')),
    workspaces TEXT NOT NULL,
    scopes TEXT,
    token_hash TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL CHECK (status IN ('pending', 'cancelled', 'accepted', 'expired')),
    invited_by TEXT,
    user_id TEXT,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    accepted_at TEXT
);
-- One pending invite per address (addresses are stored in lowercase).
CREATE UNIQUE INDEX invites_one_pending ON invites (organisation_id, email) WHERE status = 'pending';
CREATE INDEX invites_created ON invites (organisation_id, created_at);

-- A workspace's overrides of the organisation's settings (JSON; absent keys inherit).
CREATE TABLE workspace_settings (
    workspace_id TEXT PRIMARY KEY REFERENCES workspaces (id) ON DELETE CASCADE,
    settings TEXT NOT NULL,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL
);

-- Gateway deployments. `restricted` = 1: the deployment serves only the workspaces listed in
-- deployment_workspaces (none, once they are all deleted); 0: every workspace.
CREATE TABLE deployments (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    slug TEXT NOT NULL,
    name TEXT NOT NULL,
    type TEXT NOT NULL CHECK (type IN ('production', 'non-production')),
    deployment_config TEXT NOT NULL,
    restricted BIGINT NOT NULL CHECK (restricted IN (0, 1)),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    UNIQUE (organisation_id, slug)
);
CREATE INDEX deployments_type ON deployments (organisation_id, type);

CREATE TABLE deployment_workspaces (
    deployment_id TEXT NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    PRIMARY KEY (deployment_id, workspace_id)
);
CREATE INDEX deployment_workspaces_workspace ON deployment_workspaces (workspace_id);
