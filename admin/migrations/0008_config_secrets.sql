-- Secrets inside saved configs (inline api_key, AWS and Vertex credentials, the headers of
-- webhook checks) are sealed at rest. Portable SQL, as in 0001.
--
-- secrets: a JSON object from each secret's JSON Pointer in the config (/targets/0/api_key) to
-- its AES-256-GCM ciphertext (as integration secrets are; bound to the config's id and the
-- pointer); config then holds the masks the API shows in the secrets' places. '{}' for a
-- version without secrets. NULL marks a version written before this migration, whose config
-- may still hold secrets in clear: the control plane seals those when it starts with its
-- secret key (config_secrets.rs), and masks them when read until then.

ALTER TABLE config_versions ADD COLUMN secrets TEXT;
