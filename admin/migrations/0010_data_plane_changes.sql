-- The data plane's change log (admin/src/store/changes.rs): what each version of
-- data_plane_version changed, so instances re-read only that. Portable SQL, as in 0001.
--
-- kind: api_key, workspace, provider, integration, config, guardrail (id: the thing's id, a
-- provider's slug), rate_policies, usage_policies, everything (id: ''). Versions before this
-- migration have no rows: an instance behind them rebuilds everything.
CREATE TABLE data_plane_changes (
    version BIGINT NOT NULL,
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    PRIMARY KEY (version, kind, id)
);
