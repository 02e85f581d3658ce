-- Guardrails saved through the control plane (/v1/guardrails): a hook (checks and actions)
-- that routing configs, workspace defaults and the pipeline's YAML name by slug or id.
-- Portable SQL, as in 0001.
--
-- hook: the hook as the API shows it ({type, checks, deny, async, on_fail, on_success}), the
-- headers of its checks replaced by their masks; secrets: a JSON object from each such header's
-- JSON Pointer in the hook to its AES-256-GCM ciphertext (bound to the guardrail's id and the
-- pointer), '{}' when there are none. Slugs are unique across the database: configs name a
-- guardrail by slug alone.
CREATE TABLE guardrails (
    id TEXT PRIMARY KEY,
    organisation_id TEXT NOT NULL REFERENCES organisations (id),
    workspace_id TEXT NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    slug TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    hook TEXT NOT NULL,
    secrets TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('active', 'archived')),
    version BIGINT NOT NULL,
    created_by_user_id TEXT,
    created_by_key_id TEXT,
    created_at TEXT NOT NULL,
    last_updated_at TEXT NOT NULL
);
CREATE INDEX guardrails_workspace ON guardrails (organisation_id, workspace_id);
