-- Saved configs (with their versions), integrations (a provider account and its encrypted
-- secret), providers (an integration made usable in a workspace, addressed as @slug), and what
-- the data plane needs to learn of their changes. Portable SQL, as in 0001: ids, times and JSON
-- documents are text, booleans are 0/1 integers.

-- A saved routing config. Its body lives in config_versions: every update adds a version and
-- points current_version_id at it. Slugs are unique across the database: requests name a
-- config by slug alone (x-gw-config: pc-...).
CREATE TABLE configs (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    slug TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    is_default BIGINT NOT NULL CHECK (is_default IN (0, 1)),
    status TEXT NOT NULL CHECK (status IN ('active', 'archived')),
    current_version_id TEXT NOT NULL,
    version_count BIGINT NOT NULL,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL
);
CREATE INDEX configs_workspace ON configs (organisation_id, workspace_id);

CREATE TABLE config_versions (
    id TEXT PRIMARY KEY,
    config_id TEXT NOT NULL REFERENCES configs (id) ON DELETE CASCADE,
    version BIGINT NOT NULL,
    name TEXT NOT NULL,
    config TEXT NOT NULL,
    created_by_user_id TEXT,
    created_by_key_id TEXT,
    created_at TEXT NOT NULL,
    UNIQUE (config_id, version)
);

-- A provider account: the provider id of the gateway's table, its secret and settings.
-- workspace_id NULL: an organisation integration, usable by the workspaces it is enabled for
-- (integration_workspaces) or by all of them (global_workspace_access = 1).
-- key_secret and secret_settings are AES-256-GCM ciphertexts (see crypto.rs), never plaintext;
-- key_mask and secret_masks are what the API shows instead.
CREATE TABLE integrations (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    workspace_id TEXT REFERENCES workspaces (id) ON DELETE CASCADE,
    slug TEXT NOT NULL,
    name TEXT NOT NULL,
    ai_provider_id TEXT NOT NULL,
    description TEXT,
    key_secret TEXT,
    key_mask TEXT,
    settings TEXT NOT NULL,
    secret_settings TEXT,
    secret_masks TEXT NOT NULL,
    tags TEXT NOT NULL,
    global_workspace_access BIGINT NOT NULL CHECK (global_workspace_access IN (0, 1)),
    global_limits TEXT NOT NULL,
    -- 'api', or 'virtual_key' for one made by the legacy /virtual-keys alias.
    origin TEXT NOT NULL CHECK (origin IN ('api', 'virtual_key')),
    status TEXT NOT NULL CHECK (status IN ('active', 'archived')),
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    UNIQUE (organisation_id, slug)
);

CREATE TABLE integration_tags (
    integration_id TEXT NOT NULL REFERENCES integrations (id) ON DELETE CASCADE,
    tag_key TEXT NOT NULL,
    tag_value TEXT NOT NULL,
    PRIMARY KEY (integration_id, tag_key)
);
CREATE INDEX integration_tags_pair ON integration_tags (tag_key, tag_value);

-- The workspaces an organisation integration is enabled for, with their limits.
CREATE TABLE integration_workspaces (
    integration_id TEXT NOT NULL REFERENCES integrations (id) ON DELETE CASCADE,
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    usage_limits TEXT NOT NULL,
    rate_limits TEXT NOT NULL,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL,
    PRIMARY KEY (integration_id, workspace_id)
);

-- An integration made usable in one workspace: requests name it as x-gw-provider: @slug (or
-- x-gw-virtual-key: slug), so slugs are unique across the database. Deleting its integration
-- or its workspace deletes it (a workspace with configs, integrations or providers is deleted
-- only with force_delete).
CREATE TABLE providers (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    integration_id TEXT NOT NULL REFERENCES integrations (id) ON DELETE CASCADE,
    slug TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    note TEXT,
    status TEXT NOT NULL CHECK (status IN ('active', 'exhausted', 'expired')),
    usage_limits TEXT,
    current_usage DOUBLE PRECISION NOT NULL DEFAULT 0,
    rate_limits TEXT NOT NULL,
    tags TEXT NOT NULL,
    expires_at TEXT,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL
);
CREATE INDEX providers_workspace ON providers (organisation_id, workspace_id);
CREATE INDEX providers_integration ON providers (integration_id);
CREATE INDEX providers_expiry ON providers (status, expires_at);

CREATE TABLE provider_tags (
    provider_id TEXT NOT NULL REFERENCES providers (id) ON DELETE CASCADE,
    tag_key TEXT NOT NULL,
    tag_value TEXT NOT NULL,
    PRIMARY KEY (provider_id, tag_key)
);
CREATE INDEX provider_tags_pair ON provider_tags (tag_key, tag_value);

-- A value encrypted with the secret key when the first secret was stored: a start with another
-- key is refused instead of failing later on every secret.
CREATE TABLE secret_key_check (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    value TEXT NOT NULL
);

-- Bumped in the transaction of every change the data plane reads (configs, providers,
-- integrations): gateways compare it with the version of their snapshot.
CREATE TABLE data_plane_version (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO data_plane_version (id, version) VALUES (1, 0);
